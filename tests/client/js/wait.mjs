// Waiting on what a matrix-js-sdk client sees, shared by every scenario script: re-check a
// condition whenever the client processes something, with a deadline (never a sleep).
import * as sdk from "matrix-js-sdk";

export const WAIT_MS = 60000;

/** Resolves with check()'s first truthy value, re-checked on every sync, timeline event,
 * state event, member change, redaction and decryption `client` takes in; rejects after
 * WAIT_MS (and with check()'s own error if it throws). */
export function waitFor(client, what, check) {
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
      sdk.RoomEvent.Redaction,
      sdk.RoomStateEvent.Events,
      sdk.RoomMemberEvent.Name,
      sdk.RoomMemberEvent.Membership,
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

/** Resolves with the first truthy value of the async check(), asked again every
 * `everyMs` (for state only reachable through promises: the crypto store, the server);
 * rejects after WAIT_MS. */
export async function poll(what, check, everyMs = 200) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}
