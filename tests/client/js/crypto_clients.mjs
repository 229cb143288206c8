// Shared by the end-to-end encryption scenarios (e2e.mjs, e2e_devices.mjs): matrix-js-sdk
// clients with the Rust crypto (in-memory store), waiting on what they see, and reading
// what they decrypted.
import * as sdk from "matrix-js-sdk";
import { loggedInClient, registeredClient } from "./accounts.mjs";
import { poll, waitFor, WAIT_MS } from "./wait.mjs";

export { poll, waitFor, WAIT_MS };

/** A client of the new account `name` (password `${name}-password`) on its first device,
 * with crypto, not syncing yet. */
export async function cryptoClient(baseUrl, name, options = {}) {
  const client = await registeredClient(baseUrl, name, options);
  await client.initRustCrypto({ useIndexedDB: false });
  return client;
}

/** Starts syncing; resolves once the first sync is processed. */
export async function started(client) {
  await client.startClient({ initialSyncLimit: 20 });
  await waitFor(client, `${client.getUserId()}'s first sync`, () => client.isInitialSyncComplete());
  return client;
}

/** A new account `name` on its first device, with crypto, syncing. */
export async function cryptoUser(baseUrl, name, options = {}) {
  return started(await cryptoClient(baseUrl, name, options));
}

/** Another device of the existing account `name`, logged in with its password, with
 * crypto, syncing. */
export async function cryptoDevice(baseUrl, name, options = {}) {
  const client = await loggedInClient(baseUrl, name, options);
  await client.initRustCrypto({ useIndexedDB: false });
  return started(client);
}

/** An encrypted room `owner` created and `guest` joined, once `owner` sees the join. */
export async function encryptedRoom(owner, guest, { accept = () => true, attempts = 40 } = {}) {
  // `accept(roomId)`: keep creating rooms until one is accepted (a test choosing which
  // events writer a room lands on; 40 tries at 1/2 each: 2**-40 to fail).
  let roomId;
  for (let attempt = 0; ; attempt++) {
    if (attempt === attempts) throw new Error(`no acceptable room in ${attempts} tries`);
    ({ room_id: roomId } = await owner.createRoom({
      invite: [guest.getUserId()],
      initial_state: [
        { type: "m.room.encryption", state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } },
      ],
    }));
    if (accept(roomId)) break;
  }
  await waitFor(guest, "the invite", () => guest.getRoom(roomId)?.getMyMembership() === "invite");
  await guest.joinRoom(roomId);
  await waitFor(owner, "the join, seen by the room's creator", () =>
    owner.getRoom(roomId)?.getMember(guest.getUserId())?.membership === "join",
  );
  return roomId;
}

/** The bodies of the room's messages `client` has decrypted, oldest first. */
export function plaintexts(client, roomId) {
  const room = client.getRoom(roomId);
  if (!room) return [];
  return room
    .getLiveTimeline()
    .getEvents()
    .filter((e) => e.getType() === "m.room.message" && !e.isDecryptionFailure())
    .map((e) => e.getContent().body);
}

/** Waits until `client` has decrypted a message `body` in the room; all it decrypted. */
export function decrypts(client, roomId, body, what) {
  return waitFor(client, what, () => {
    const seen = plaintexts(client, roomId);
    return seen.includes(body) && seen;
  });
}
