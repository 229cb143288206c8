// Presence as matrix-js-sdk shows it: bob watches alice, a room-mate, while alice's client
// syncs (short long polls keep her online), then after alice's client stops (the server,
// configured with short timeouts, makes her unavailable, then offline).
// Usage: node presence.mjs BASE_URL. Prints one JSON line: the presence states bob saw
// for alice, with the milliseconds since alice's client stopped (negative: before).
import { logger } from "matrix-js-sdk/lib/logger.js";
import { ClientEvent, UserEvent } from "matrix-js-sdk";
import { registeredClient } from "./accounts.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];
const WAIT_MS = 60000;

function waitFor(what, check, subscribe) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), WAIT_MS);
    const done = () => {
      if (check()) {
        clearTimeout(timer);
        resolve();
        return true;
      }
      return false;
    };
    if (!done()) subscribe(done);
  });
}

async function main() {
  const alice = await registeredClient(baseUrl, "alice");
  const bob = await registeredClient(baseUrl, "bob");
  const { room_id: roomId } = await alice.createRoom({ name: "presence" });
  await alice.invite(roomId, bob.getUserId());
  await bob.joinRoom(roomId);
  const seen = [];
  let stoppedAt = null;
  bob.on(UserEvent.Presence, (event, user) => {
    if (user.userId === alice.getUserId()) {
      seen.push({ presence: user.presence, ms: stoppedAt === null ? -1 : Date.now() - stoppedAt });
    }
  });
  const presence = () => bob.getUser(alice.getUserId())?.presence;
  const onPresence = (done) => bob.on(UserEvent.Presence, () => done());
  const bobReady = new Promise((resolve) => bob.once(ClientEvent.Sync, resolve));
  bob.startClient({ initialSyncLimit: 1 });
  await bobReady;
  alice.startClient({ initialSyncLimit: 1, pollTimeout: 500 });
  await waitFor("alice online", () => presence() === "online", onPresence);
  alice.stopClient();
  stoppedAt = Date.now();
  await waitFor("alice offline", () => presence() === "offline", onPresence);
  bob.stopClient();
  console.log(JSON.stringify({ seen }));
  process.exit(0);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
