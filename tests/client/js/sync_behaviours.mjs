// What matrix-js-sdk shows of two /sync behaviours (issue 20): a banned user's client,
// after a fresh login, lists the room among its left rooms (with who banned them and
// why); a user who left and rejoins sees the history sent while away that the room's
// history visibility lets them see. Usage: node sync_behaviours.mjs BASE_URL. Prints one
// JSON line of what the clients showed; exits non-zero on the first failure.
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";
import { registeredClient } from "./accounts.mjs";
import { waitFor } from "./wait.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];
async function started(client, name) {
  await client.startClient({ initialSyncLimit: 20 });
  await waitFor(client, `${name}'s first sync`, () => client.isInitialSyncComplete());
  return client;
}

function bodies(client, roomId) {
  const room = client.getRoom(roomId);
  if (!room) return [];
  return room
    .getLiveTimeline()
    .getEvents()
    .filter((e) => e.getType() === "m.room.message")
    .map((e) => e.getContent().body);
}

async function bannedUserAfterAFreshLogin() {
  const owner = await registeredClient(baseUrl, "banner");
  const banned = await registeredClient(baseUrl, "banned");
  const { room_id: roomId } = await owner.createRoom({ preset: "public_chat", name: "strict room" });
  await banned.joinRoom(roomId);
  await owner.sendMessage(roomId, { msgtype: "m.text", body: "rules" });
  await owner.ban(roomId, banned.getUserId(), "spam");
  await owner.sendMessage(roomId, { msgtype: "m.text", body: "after the ban" });
  // A fresh login: a new client with an empty store, whose first sync is an initial one.
  const fresh = sdk.createClient({
    baseUrl,
    accessToken: banned.getAccessToken(),
    userId: banned.getUserId(),
    deviceId: banned.getDeviceId(),
  });
  await started(fresh, "the banned user");
  const room = fresh.getRoom(roomId);
  const report = {
    // Element's "left rooms": the rooms whose own membership is leave or ban.
    left: fresh
      .getRooms()
      .filter((r) => ["leave", "ban"].includes(r.getMyMembership()))
      .map((r) => r.roomId === roomId),
    membership: room ? room.getMyMembership() : null,
    member: null,
    seen: bodies(fresh, roomId),
  };
  const member = room?.currentState.getMember(banned.getUserId());
  if (member) {
    report.member = {
      membership: member.membership,
      by: member.events.member?.getSender() === owner.getUserId(),
      reason: member.events.member?.getContent().reason ?? null,
    };
  }
  fresh.stopClient();
  return report;
}

async function rejoiningUser() {
  const alice = await registeredClient(baseUrl, "stayer");
  const bob = await started(await registeredClient(baseUrl, "rejoiner"), "bob");
  const { room_id: roomId } = await alice.createRoom({ preset: "public_chat", name: "shared room" });
  await bob.joinRoom(roomId);
  await alice.sendMessage(roomId, { msgtype: "m.text", body: "together" });
  await waitFor(bob, "bob sees 'together'", () => bodies(bob, roomId).includes("together"));
  await bob.leave(roomId);
  await waitFor(bob, "bob's leave", () => bob.getRoom(roomId)?.getMyMembership() === "leave");
  for (const n of [0, 1, 2]) {
    await alice.sendMessage(roomId, { msgtype: "m.text", body: `away ${n}` });
  }
  // bob's client syncs on while away: once it has seen something newer than the
  // messages, its token is past them (they must come with the rejoin, not as news).
  await bob.setAccountData("org.example.mark", { after: "away" });
  await waitFor(bob, "bob's client past the messages", () => bob.getAccountData("org.example.mark"));
  await bob.joinRoom(roomId);
  await alice.sendMessage(roomId, { msgtype: "m.text", body: "welcome back" });
  await waitFor(bob, "bob sees 'welcome back'", () => bodies(bob, roomId).includes("welcome back"));
  const report = { rejoined: bodies(bob, roomId) };
  bob.stopClient();
  return report;
}

async function main() {
  const report = { ...(await bannedUserAfterAFreshLogin()), ...(await rejoiningUser()) };
  console.log(JSON.stringify(report));
  process.exit(0);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
