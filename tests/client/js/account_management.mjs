// matrix-js-sdk's account management calls against a roomstream homeserver, as a client
// makes them: getCapabilities, setPassword through user-interactive auth (the 401 first,
// then the password stage with its session), the start-up calls (TURN, third-party
// protocols, 3PIDs), guest registration while it is off, and deactivateAccount.
// Usage: node account_management.mjs BASE_URL. Prints one JSON line of what it saw; exits
// non-zero on the first failure.
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";
import { registeredClient } from "./accounts.mjs";

logger.setLevel("error");
const baseUrl = process.argv[2];

async function errcodeOf(promise) {
  try {
    await promise;
    return null;
  } catch (err) {
    return { status: err.httpStatus, errcode: err.errcode, data: err.data };
  }
}

function passwordAuth(userId, password, session) {
  return { type: "m.login.password", identifier: { type: "m.id.user", user: userId }, password, session };
}

async function login(password) {
  const client = sdk.createClient({ baseUrl });
  const done = await client.loginRequest({
    type: "m.login.password",
    identifier: { type: "m.id.user", user: "jess" },
    password,
  });
  return sdk.createClient({ baseUrl, accessToken: done.access_token, userId: done.user_id });
}

async function main() {
  const jess = await registeredClient(baseUrl, "jess");
  const userId = jess.getUserId();
  const report = {};
  const capabilities = await jess.getCapabilities();
  report.changePassword = capabilities["m.change_password"];
  const other = await login("jess-password");
  // First without auth: the 401 carries the flows and the session to answer in.
  const first = await errcodeOf(jess.setPassword({}, "jess-new-password"));
  report.flows = first.data.flows;
  await jess.setPassword(passwordAuth(userId, "jess-password", first.data.session), "jess-new-password");
  report.stillLoggedIn = (await jess.whoami()).user_id === userId;
  report.otherDevice = (await errcodeOf(other.whoami())).errcode;
  report.oldPassword = (await errcodeOf(login("jess-password"))).errcode;
  await login("jess-new-password");
  report.turn = await jess.turnServer();
  report.protocols = await jess.getThirdpartyProtocols();
  report.threepids = await jess.getThreePids();
  report.guest = (await errcodeOf(sdk.createClient({ baseUrl }).registerGuest())).errcode;
  report.deactivated = await jess.deactivateAccount(passwordAuth(userId, "jess-new-password"));
  report.afterDeactivation = (await errcodeOf(login("jess-new-password"))).errcode;
  console.log(JSON.stringify(report));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
