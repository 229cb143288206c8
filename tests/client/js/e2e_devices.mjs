// matrix-js-sdk with its Rust crypto against a roomstream homeserver: a user's second
// device. Alice sets up cross-signing, replaces it (which needs her password through
// user-interactive auth), sets up secret storage under a recovery key and a server-side
// key backup; her room key reaches the backup. A new device of hers logs in, restores the
// backup with the recovery key from secret storage and decrypts a message sent before it
// existed; it imports the cross-signing keys from secret storage and signs itself, and her
// first device sees it cross-signing verified. Bob's running client learns of the new
// device through device_lists in /sync and decrypts what it sends.
// Usage: node e2e_devices.mjs BASE_URL. Prints one JSON line (the report); exits non-zero
// with the reason on the first failure.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { decodeRecoveryKey } from "matrix-js-sdk/lib/crypto-api/index.js";
import { password } from "./accounts.mjs";
import {
  cryptoClient,
  cryptoDevice,
  cryptoUser,
  decrypts,
  encryptedRoom,
  plaintexts,
  poll,
  started,
} from "./crypto_clients.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];
const HISTORY = "before the second device";
const FROM_SECOND = "from the second device";

/** cryptoCallbacks opening secret storage with `holder.key` (the recovery key), whatever
 * the key's ID: what a user typing in their recovery key does. */
function recoveryKeyCallbacks(holder) {
  return {
    getSecretStorageKey: async ({ keys }) =>
      holder.key ? [Object.keys(keys)[0], holder.key] : null,
  };
}

/** An authUploadDeviceSigningKeys callback: first without auth, then answering the server's
 * 401 with the account's password (m.login.password in the server's session). Appends
 * what each upload needed to `record`. */
function passwordAuth(client, name, record) {
  return async (makeRequest) => {
    try {
      await makeRequest(null);
      record.push("none");
      return;
    } catch (err) {
      const stages = (err.data?.flows ?? []).flatMap((flow) => flow.stages);
      if (err.httpStatus !== 401 || !stages.includes("m.login.password")) throw err;
      await makeRequest({
        type: "m.login.password",
        identifier: { type: "m.id.user", user: client.getUserId() },
        password: password(name),
        session: err.data.session,
      });
      record.push("m.login.password");
    }
  };
}

/** The master key the server hands out for the client's user. */
async function serverMasterKey(client) {
  const userId = client.getUserId();
  const answer = await client.http.authedRequest("POST", "/keys/query", undefined, {
    device_keys: { [userId]: [] },
  });
  const master = answer.master_keys?.[userId];
  return master ? Object.values(master.keys)[0] : null;
}

/** The session IDs the server's key backup `version` holds for the room. */
async function backedUpSessions(client, version, roomId) {
  const path = `/room_keys/keys/${encodeURIComponent(roomId)}`;
  const answer = await client.http.authedRequest("GET", path, { version });
  return Object.keys(answer.sessions ?? {});
}

/** The device IDs `client` knows for `userId`, sorted. */
async function knownDevices(client, userId) {
  const devices = (await client.getCrypto().getUserDeviceInfo([userId], true)).get(userId);
  return devices ? [...devices.keys()].sort() : [];
}

function verification(status) {
  return status && {
    crossSigningVerified: status.crossSigningVerified,
    signedByOwner: status.signedByOwner,
    localVerified: status.localVerified,
  };
}

async function main() {
  const report = {};
  const aliceKey = { key: null };
  const alice = await cryptoClient(baseUrl, "alice", {
    cryptoCallbacks: recoveryKeyCallbacks(aliceKey),
  });
  const crypto = alice.getCrypto();

  // 1. Cross-signing, set up then replaced: the first upload needs no auth, replacing the
  // master key needs the password. Both before Alice syncs: a /keys/query answered while
  // the replacement's auth round trip is under way carries the old master key, and the
  // Rust crypto then drops the new private keys (a client-side race, as against Synapse).
  const uia = [];
  const auth = passwordAuth(alice, "alice", uia);
  await crypto.bootstrapCrossSigning({ authUploadDeviceSigningKeys: auth });
  const firstMaster = await serverMasterKey(alice);
  await crypto.bootstrapCrossSigning({
    authUploadDeviceSigningKeys: auth,
    setupNewCrossSigning: true,
  });
  const master = await serverMasterKey(alice);
  report.uia = uia;
  report.masterKeys = [firstMaster, master];
  await started(alice);
  const bob = await cryptoUser(baseUrl, "bob");

  // Secret storage under a recovery key, holding the cross-signing keys and the key
  // backup's decryption key; a new key backup.
  const recoveryKey = await crypto.createRecoveryKeyFromPassphrase();
  aliceKey.key = recoveryKey.privateKey;
  await crypto.bootstrapSecretStorage({
    createSecretStorageKey: async () => recoveryKey,
    setupNewSecretStorage: true,
    setupNewKeyBackup: true,
  });
  report.crossSigningReady = await crypto.isCrossSigningReady();
  report.secretStorageReady = await crypto.isSecretStorageReady();
  report.crossSigningKeyId = await crypto.getCrossSigningKeyId();
  const check = await crypto.checkKeyBackupAndEnable();
  const version = check?.backupInfo?.version ?? null;
  report.backupVersion = version;
  report.backupTrusted = Boolean(check?.trustInfo?.trusted);
  report.backupActive = (await crypto.getActiveSessionBackupVersion()) === version;

  // The history: a message from Alice's first device; its room key reaches the backup.
  const roomId = await encryptedRoom(alice, bob);
  await alice.sendTextMessage(roomId, HISTORY);
  await decrypts(bob, roomId, HISTORY, "bob decrypts the first message");
  report.backedUpSessions = (
    await poll("alice's room key in the backup", async () => {
      const sessions = await backedUpSessions(alice, version, roomId);
      return sessions.length > 0 && sessions;
    })
  ).length;
  report.bobSawBefore = await knownDevices(bob, alice.getUserId());

  // 2. The second device: the history is there, undecryptable, until it restores the
  // backup with the recovery key (room key requests are off in the Rust crypto, so the
  // keys can only come from the backup).
  const secondKey = { key: decodeRecoveryKey(recoveryKey.encodedPrivateKey) };
  const second = await cryptoDevice(baseUrl, "alice", {
    cryptoCallbacks: recoveryKeyCallbacks(secondKey),
  });
  const loggedInAt = Date.now();
  const secondCrypto = second.getCrypto();
  const secondId = second.getDeviceId();
  report.firstDeviceId = alice.getDeviceId();
  report.secondDeviceId = secondId;
  const history = second
    .getRoom(roomId)
    ?.getLiveTimeline()
    .getEvents()
    .filter((e) => e.getSender() === alice.getUserId() && e.getWireType() === "m.room.encrypted");
  report.historyBeforeRestore = {
    encryptedEvents: history?.length ?? 0,
    decrypted: plaintexts(second, roomId),
  };
  await secondCrypto.loadSessionBackupPrivateKeyFromSecretStorage();
  const secondCheck = await secondCrypto.checkKeyBackupAndEnable();
  report.secondBackupVersion = secondCheck?.backupInfo?.version ?? null;
  const restored = await secondCrypto.restoreKeyBackup();
  report.restored = { total: restored.total, imported: restored.imported };
  report.secondRead = await decrypts(
    second,
    roomId,
    HISTORY,
    "the second device decrypts the history",
  );

  // 3. The second device takes the cross-signing keys from secret storage and signs
  // itself (once it has the public keys from /keys/query: the import checks the private
  // keys against them); the first device sees that (its own user's device list changed).
  await poll("the second device has alice's public cross-signing keys", async () => {
    return (await secondCrypto.getCrossSigningStatus()).publicKeysOnDevice;
  });
  await secondCrypto.bootstrapCrossSigning({ authUploadDeviceSigningKeys: auth });
  report.uiaAfterSecond = [...uia];
  report.secondCrossSigningReady = await secondCrypto.isCrossSigningReady();
  report.secondCrossSigningKeyId = await secondCrypto.getCrossSigningKeyId();
  report.firstSeesSecond = verification(
    await poll("the first device sees the second verified", async () => {
      const status = await crypto.getDeviceVerificationStatus(alice.getUserId(), secondId);
      return status?.crossSigningVerified && status;
    }),
  );

  // 4. Bob, syncing all along, learns of the new device from device_lists in /sync, and of
  // its signature by Alice's self-signing key; he decrypts what the new device sends.
  report.bobSees = await poll("bob sees the second device", async () => {
    const devices = await knownDevices(bob, alice.getUserId());
    return devices.includes(secondId) && devices;
  });
  report.bobSawNewDeviceAfterMs = Date.now() - loggedInAt;
  report.bobSeesSecond = verification(
    await poll("bob sees the second device signed by alice", async () => {
      const status = await bob.getCrypto().getDeviceVerificationStatus(alice.getUserId(), secondId);
      return status?.signedByOwner && status;
    }),
  );
  await second.sendTextMessage(roomId, FROM_SECOND);
  report.bobRead = await decrypts(bob, roomId, FROM_SECOND, "bob decrypts the second device");
  const event = bob
    .getRoom(roomId)
    .getLiveTimeline()
    .getEvents()
    .find((e) => !e.isDecryptionFailure() && e.getContent().body === FROM_SECOND);
  report.fromSecond = { sender: event.getSender(), wireType: event.getWireType() };
  report.finalMasterKey = await serverMasterKey(second);

  for (const client of [alice, bob, second]) client.stopClient();
  console.log(JSON.stringify(report));
  process.exit(0);
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
