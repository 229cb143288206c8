// matrix-js-sdk with its Rust crypto (initRustCrypto, in-memory store) against a roomstream
// homeserver: two users, an encrypted room, each reads the other's messages decrypted.
// Usage: node e2e.mjs [--room-shard I/N] ALICE_URL [BOB_URL]. Alice's client talks to
// ALICE_URL, Bob's to BOB_URL (default: the same). With --room-shard, Alice creates rooms
// until one whose ID hashes to shard I of N (roomstream.replication.sharding.shard_for:
// the first 8 bytes of SHA-256 of the room ID, big-endian, modulo N), so a test can put
// the room on a chosen events writer. Prints one JSON line of what each user read; exits
// non-zero with the reason on the first failure.
import { createHash } from "node:crypto";
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";
import { registeredClient } from "./accounts.mjs";

logger.setLevel("error");
const args = process.argv.slice(2);
let roomShard = null;
if (args[0] === "--room-shard") {
  const [index, count] = args[1].split("/").map(BigInt);
  roomShard = { index, count };
  args.splice(0, 2);
}
const [aliceUrl, bobUrl = aliceUrl] = args;
const WAIT_MS = 60000;
const MAX_ROOMS = 40; // each room lands on the wanted shard of 2 with 1/2: 2**-40 to fail

function shardOf(roomId) {
  const digest = createHash("sha256").update(roomId, "utf8").digest();
  return digest.readBigUInt64BE(0) % roomShard.count;
}

function waitFor(client, what, check) {
  // Re-checks on every sync, timeline event and decryption.
  return new Promise((resolve, reject) => {
    const done = () => {
      let value;
      try {
        value = check();
      } catch (err) {
        cleanup();
        reject(err);
        return;
      }
      if (value) {
        cleanup();
        resolve(value);
      }
    };
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`timed out waiting for ${what}`));
    }, WAIT_MS);
    const events = [
      sdk.ClientEvent.Sync,
      sdk.RoomEvent.Timeline,
      sdk.RoomEvent.MyMembership,
      sdk.MatrixEventEvent.Decrypted,
    ];
    const cleanup = () => {
      clearTimeout(timer);
      for (const name of events) client.off(name, done);
    };
    for (const name of events) client.on(name, done);
    done();
  });
}

async function user(name, baseUrl) {
  const client = await registeredClient(baseUrl, name);
  await client.initRustCrypto({ useIndexedDB: false });
  await client.startClient({ initialSyncLimit: 20 });
  await waitFor(client, `${name}'s first sync`, () => client.isInitialSyncComplete());
  return client;
}

function plaintexts(client, roomId) {
  const room = client.getRoom(roomId);
  if (!room) return [];
  return room
    .getLiveTimeline()
    .getEvents()
    .filter((e) => e.getType() === "m.room.message" && !e.isDecryptionFailure())
    .map((e) => e.getContent().body);
}

async function main() {
  const alice = await user("alice", aliceUrl);
  const bob = await user("bob", bobUrl);
  let roomId;
  for (let attempt = 0; ; attempt++) {
    if (attempt === MAX_ROOMS) throw new Error(`no room on shard ${roomShard.index}`);
    ({ room_id: roomId } = await alice.createRoom({
      invite: [bob.getUserId()],
      initial_state: [
        { type: "m.room.encryption", state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } },
      ],
    }));
    if (roomShard === null || shardOf(roomId) === roomShard.index) break;
  }
  await waitFor(bob, "bob's invite", () => bob.getRoom(roomId)?.getMyMembership() === "invite");
  await bob.joinRoom(roomId);
  await waitFor(alice, "bob joined, seen by alice", () =>
    alice.getRoom(roomId)?.getMember(bob.getUserId())?.membership === "join",
  );
  await alice.sendTextMessage(roomId, "secret from alice");
  const bobRead = await waitFor(bob, "bob decrypts", () => {
    const seen = plaintexts(bob, roomId);
    return seen.includes("secret from alice") && seen;
  });
  await bob.sendTextMessage(roomId, "secret from bob");
  const aliceRead = await waitFor(alice, "alice decrypts", () => {
    const seen = plaintexts(alice, roomId);
    return seen.includes("secret from bob") && seen;
  });
  // What the server stored is ciphertext only.
  const raw = await bob.createMessagesRequest(roomId, null, 10, "b");
  const types = raw.chunk.filter((e) => e.sender === alice.getUserId()).map((e) => e.type);
  const encrypted = alice.getRoom(roomId).hasEncryptionStateEvent();
  alice.stopClient();
  bob.stopClient();
  console.log(JSON.stringify({ roomId, bobRead, aliceRead, types, encrypted }));
  process.exit(0);
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
