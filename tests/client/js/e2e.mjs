// matrix-js-sdk with its Rust crypto (initRustCrypto, in-memory store) against a roomstream
// homeserver: two users, an encrypted room, each reads the other's messages decrypted.
// Usage: node e2e.mjs BASE_URL. Prints one JSON line of what each user read; exits
// non-zero with the reason on the first failure.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { cryptoUser, decrypts, encryptedRoom } from "./crypto_clients.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];

async function main() {
  const alice = await cryptoUser(baseUrl, "alice");
  const bob = await cryptoUser(baseUrl, "bob");
  const roomId = await encryptedRoom(alice, bob);
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
  console.log(JSON.stringify({ bobRead, aliceRead, types, encrypted }));
  process.exit(0);
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
