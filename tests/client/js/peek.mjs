// matrix-js-sdk's room preview ("peeking") against a roomstream homeserver: a user who is
// not in a world_readable room reads it with peekInRoom (the room initialSync, then the
// old event stream /events?room_id= for live updates). Usage: node peek.mjs BASE_URL.
// Prints one JSON line of what the peeker saw; exits non-zero on the first failure.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { RoomEvent } from "matrix-js-sdk";
import { registeredClient } from "./accounts.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];
const WAIT_MS = 30000;

function bodies(room) {
  return room
    .getLiveTimeline()
    .getEvents()
    .filter((e) => e.getType() === "m.room.message")
    .map((e) => e.getContent().body);
}

async function main() {
  const owner = await registeredClient(baseUrl, "owner");
  const peeker = await registeredClient(baseUrl, "peeker");
  const { room_id: roomId } = await owner.createRoom({
    preset: "public_chat",
    name: "open room",
    initial_state: [
      { type: "m.room.history_visibility", state_key: "", content: { history_visibility: "world_readable" } },
    ],
  });
  await owner.sendMessage(roomId, { msgtype: "m.text", body: "before the peek" });
  const room = await peeker.peekInRoom(roomId);
  const initial = bodies(room);
  const name = room.name;
  const live = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out waiting for the live message")), WAIT_MS);
    room.on(RoomEvent.Timeline, (event) => {
      if (event.getType() === "m.room.message" && event.getContent().body === "live") {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  await owner.sendMessage(roomId, { msgtype: "m.text", body: "live" });
  await live;
  const report = { initial, name, after: bodies(room) };
  peeker.stopPeeking();
  console.log(JSON.stringify(report));
  process.exit(0);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
