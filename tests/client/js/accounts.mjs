// Shared by the scenarios: a new account registered the way Element does (the dummy
// auth flow), as a matrix-js-sdk client that has not started syncing.
import * as sdk from "matrix-js-sdk";

export async function registeredClient(baseUrl, name) {
  const anonymous = sdk.createClient({ baseUrl });
  const registered = await anonymous.registerRequest({
    username: name,
    password: `${name}-password`,
    auth: { type: "m.login.dummy" },
  });
  return sdk.createClient({
    baseUrl,
    accessToken: registered.access_token,
    userId: registered.user_id,
    deviceId: registered.device_id,
  });
}
