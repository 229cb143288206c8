// Shared by the scenarios: a new account registered the way Element does (the dummy
// auth flow), or a new device of an existing one, as a matrix-js-sdk client that has not
// started syncing. Every account's password is `${name}-password`; `options` go to
// createClient (cryptoCallbacks, for one).
import * as sdk from "matrix-js-sdk";

export function password(name) {
  return `${name}-password`;
}

function client(baseUrl, session, options) {
  return sdk.createClient({
    ...options,
    baseUrl,
    accessToken: session.access_token,
    userId: session.user_id,
    deviceId: session.device_id,
  });
}

export async function registeredClient(baseUrl, name, options = {}) {
  const anonymous = sdk.createClient({ baseUrl });
  const registered = await anonymous.registerRequest({
    username: name,
    password: password(name),
    auth: { type: "m.login.dummy" },
  });
  return client(baseUrl, registered, options);
}

export async function loggedInClient(baseUrl, name, options = {}) {
  const anonymous = sdk.createClient({ baseUrl });
  const session = await anonymous.loginRequest({
    type: "m.login.password",
    identifier: { type: "m.id.user", user: name },
    password: password(name),
  });
  return client(baseUrl, session, options);
}
