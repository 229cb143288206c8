// matrix-js-sdk with its Rust crypto (initRustCrypto, in-memory store) against a roomstream
// homeserver: two users, an encrypted room, each reads the other's messages decrypted.
// Usage: node e2e.mjs [--room-shard I/N] ALICE_URL [BOB_URL]. Alice's client talks to
// ALICE_URL, Bob's to BOB_URL (default: the same). With --room-shard, Alice creates rooms
// until one whose ID hashes to shard I of N (roomstream.replication.sharding.shard_for:
// the first 8 bytes of SHA-256 of the room ID, big-endian, modulo N), so a test can put
// the room on a chosen events writer. Prints one JSON line of what each user read; exits
// non-zero with the reason on the first failure.
import { createHash } from "node:crypto";
import { logger } from "matrix-js-sdk/lib/logger.js";
import { cryptoUser, decrypts, encryptedRoom } from "./crypto_clients.mjs";

logger.setLevel("error");
const args = process.argv.slice(2);
let roomShard = null;
if (args[0] === "--room-shard") {
  const [index, count] = args[1].split("/").map(BigInt);
  roomShard = { index, count };
  args.splice(0, 2);
}
const [aliceUrl, bobUrl = aliceUrl] = args;

function onWantedShard(roomId) {
  if (roomShard === null) return true;
  const digest = createHash("sha256").update(roomId, "utf8").digest();
  return digest.readBigUInt64BE(0) % roomShard.count === roomShard.index;
}

async function main() {
  const alice = await cryptoUser(aliceUrl, "alice");
  const bob = await cryptoUser(bobUrl, "bob");
  const roomId = await encryptedRoom(alice, bob, { accept: onWantedShard });
  await alice.sendTextMessage(roomId, "secret from alice");
  const bobRead = await decrypts(bob, roomId, "secret from alice", "bob decrypts");
  await bob.sendTextMessage(roomId, "secret from bob");
  const aliceRead = await decrypts(alice, roomId, "secret from bob", "alice decrypts");
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
