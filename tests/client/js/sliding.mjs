// matrix-js-sdk's SlidingSync (the simplified sliding sync client Element Web uses) against
// a roomstream homeserver. Usage: node sliding.mjs BASE_URL. Prints one JSON line of what
// the client saw; exits non-zero with the reason on the first failure.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { SlidingSync, SlidingSyncEvent, SlidingSyncState } from "matrix-js-sdk/lib/sliding-sync.js";
import { registeredClient } from "./accounts.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];
const WAIT_MS = 30000;

async function main() {
  const client = await registeredClient(baseUrl, "slider");
  const rooms = [];
  for (let i = 0; i < 3; i++) {
    const { room_id: roomId } = await client.createRoom({ name: `js ${i}` });
    await client.sendMessage(roomId, { msgtype: "m.text", body: `first ${i}` });
    rooms.push(roomId);
  }
  const list = {
    ranges: [[0, 19]],
    timeline_limit: 1,
    required_state: [["m.room.name", ""]],
  };
  const sliding = new SlidingSync(baseUrl, new Map([["all", list]]), { timeline_limit: 1, required_state: [] }, client, 10000);
  const seen = {};
  const names = {};
  sliding.on(SlidingSyncEvent.RoomData, (roomId, data) => {
    if (data.name) names[roomId] = data.name;
    for (const event of data.timeline ?? []) {
      if (event.type === "m.room.message") (seen[roomId] ??= []).push(event.content.body);
    }
  });
  let responses = 0;
  let count = null;
  const live = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out waiting for the live message")), WAIT_MS);
    sliding.on(SlidingSyncEvent.Lifecycle, async (state, resp, err) => {
      if (err) {
        clearTimeout(timer);
        reject(err);
        return;
      }
      if (state !== SlidingSyncState.Complete) return;
      responses += 1;
      if (responses === 1) {
        count = sliding.getListData("all")?.joinedCount ?? null;
        await client.sendMessage(rooms[0], { msgtype: "m.text", body: "live" });
      } else if ((seen[rooms[0]] ?? []).includes("live")) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  const running = sliding.start();
  await live;
  sliding.stop();
  await running.catch(() => {});
  const report = {
    count,
    names: rooms.map((r) => names[r] ?? null),
    seen: rooms.map((r) => seen[r] ?? []),
  };
  console.log(JSON.stringify(report));
  process.exit(0);
}

main().catch((err) => {
  console.error(err?.stack ?? String(err));
  process.exit(1);
});
