// matrix-js-sdk (the SDK under Element Web) against a roomstream homeserver, used as an
// application would use it. Usage: node scenario.mjs BASE_URL. Prints one JSON line of
// what the users saw; exits non-zero with the reason on the first failure.
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";
import { registeredClient } from "./accounts.mjs";
import { waitFor } from "./wait.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];
async function user(name) {
  const client = await registeredClient(baseUrl, name);
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
    .filter((e) => e.getType() === "m.room.message" && !e.isRedacted())
    .map((e) => e.getContent().body);
}

async function pageBack(client, roomId, limit) {
  // Walks /messages back from the end of the room, as a client scrolling up does.
  const seen = [];
  let from = null;
  for (let i = 0; i < 20; i++) {
    const page = await client.createMessagesRequest(roomId, from, limit, sdk.Direction.Backward);
    for (const event of page.chunk) {
      if (event.type === "m.room.message") seen.push(event.content.body ?? "<redacted>");
    }
    if (!page.end) break;
    from = page.end;
  }
  return seen;
}

const report = {};
const alice = await user("alice");
const bob = await user("bob");
const carol = await user("carol");
try {
  const { room_id: roomId } = await alice.createRoom({ name: "js room", invite: [bob.getUserId()] });
  await waitFor(bob, "bob's invite", () => bob.getRoom(roomId)?.getMyMembership() === "invite");
  await bob.joinRoom(roomId);

  const sent = await alice.sendMessage(roomId, { msgtype: "m.text", body: "hi bob" });
  await waitFor(bob, "alice's message at bob", () => bodies(bob, roomId).includes("hi bob"));
  await bob.sendMessage(roomId, { msgtype: "m.text", body: "hi alice" });
  await waitFor(alice, "bob's reply at alice", () => bodies(alice, roomId).includes("hi alice"));
  report.bob_saw = bodies(bob, roomId);

  await alice.redactEvent(roomId, sent.event_id, undefined, { reason: "typo" });
  await waitFor(bob, "the redaction at bob", () => !bodies(bob, roomId).includes("hi bob"));

  for (let i = 0; i < 25; i++) {
    await alice.sendMessage(roomId, { msgtype: "m.text", body: `n${i}` });
  }
  await waitFor(bob, "the last message at bob", () => bodies(bob, roomId).includes("n24"));
  report.paged_back = await pageBack(bob, roomId, 10);

  await alice.sendStateEvent(roomId, "m.room.topic", { topic: "js topic" }, "");
  await waitFor(
    bob,
    "the topic at bob",
    () => bob.getRoom(roomId)?.currentState.getStateEvents("m.room.topic", "")?.getContent().topic === "js topic",
  );
  report.topic = "js topic";

  await bob.leave(roomId);
  await waitFor(bob, "bob's leave", () => bob.getRoom(roomId)?.getMyMembership() === "leave");
  report.bob_left = true;

  // Partial visibility: carol joins a room whose history is visible to members only.
  const { room_id: secretId } = await alice.createRoom({
    preset: "public_chat",
    initial_state: [
      { type: "m.room.history_visibility", state_key: "", content: { history_visibility: "joined" } },
    ],
  });
  await alice.sendMessage(secretId, { msgtype: "m.text", body: "before carol" });
  await carol.joinRoom(secretId);
  await alice.sendMessage(secretId, { msgtype: "m.text", body: "after carol" });
  await waitFor(carol, "the message after joining", () => bodies(carol, secretId).includes("after carol"));
  report.carol_paged = await pageBack(carol, secretId, 10);
  report.alice_paged = await pageBack(alice, secretId, 10);
  console.log(JSON.stringify(report));
} finally {
  for (const client of [alice, bob, carol]) client.stopClient();
}
process.exit(0);
