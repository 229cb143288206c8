// Profiles seen through matrix-js-sdk against a roomstream homeserver: a display name and
// an avatar one user sets show on the other user's member list and in the room's member
// events, and a user invited after setting a name is listed under it.
// Usage: node profiles.mjs BASE_URL. Prints one JSON line of what the users saw; exits
// non-zero with the reason on the first failure.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { registeredClient } from "./accounts.mjs";
import { waitFor } from "./wait.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];
async function syncing(name) {
  const client = await registeredClient(baseUrl, name);
  await client.startClient({ initialSyncLimit: 30 });
  await waitFor(client, `${name}'s first sync`, () => client.isInitialSyncComplete());
  return client;
}

function memberEvents(client, roomId, userId) {
  return client
    .getRoom(roomId)
    .getLiveTimeline()
    .getEvents()
    .filter((e) => e.getType() === "m.room.member" && e.getStateKey() === userId)
    .map((e) => ({
      membership: e.getContent().membership,
      displayname: e.getContent().displayname ?? null,
      avatar_url: e.getContent().avatar_url ?? null,
    }));
}

async function main() {
  const alice = await syncing("alice");
  const bob = await syncing("bob");
  const carol = await registeredClient(baseUrl, "carol");
  const aliceId = alice.getUserId();
  const bobId = bob.getUserId();
  const carolId = carol.getUserId();

  const { room_id: roomId } = await alice.createRoom({ name: "profiles", invite: [bobId] });
  await waitFor(bob, "bob's invite", () => bob.getRoom(roomId));
  await bob.joinRoom(roomId);
  const before = await waitFor(bob, "alice on bob's member list", () => {
    const member = bob.getRoom(roomId)?.getMember(aliceId);
    return member && member.membership === "join" && { name: member.name };
  });

  // One change at a time (each seen before the next), so that each has its own event.
  await alice.setDisplayName("Alice Liddell");
  await waitFor(bob, "alice's new name on bob's member list", () => {
    return bob.getRoom(roomId).getMember(aliceId).name === "Alice Liddell";
  });
  await alice.setAvatarUrl("mxc://wonderland.example/alice");
  const after = await waitFor(bob, "alice's new avatar on bob's member list", () => {
    const member = bob.getRoom(roomId).getMember(aliceId);
    const avatar = member.getMxcAvatarUrl();
    return (
      member.name === "Alice Liddell" &&
      avatar === "mxc://wonderland.example/alice" && { name: member.name, avatar }
    );
  });

  // Carol names herself before she is invited: the invite carries her name.
  await carol.setDisplayName("Carol Queen");
  await alice.invite(roomId, carolId);
  const invited = await waitFor(bob, "carol's invite on bob's member list", () => {
    const member = bob.getRoom(roomId).getMember(carolId);
    return member && member.membership === "invite" && { name: member.name };
  });
  const profile = await bob.getProfileInfo(aliceId);

  const report = {
    before,
    after,
    invited,
    profile,
    alice_member_events: memberEvents(bob, roomId, aliceId),
    bob_own_name: bob.getRoom(roomId).getMember(bobId).name,
  };
  alice.stopClient();
  bob.stopClient();
  console.log(JSON.stringify(report));
  process.exit(0);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
