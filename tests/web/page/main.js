// Hydrogen's full web app, started as its own entry point does (hydrogen-web's
// src/platform/web/main.js): Platform, navigation and URL router, RootViewModel, RootView.
// `?e2ee=off` in the page's URL leaves olm out of the asset paths: Hydrogen then never
// creates an end-to-end identity (no /keys/upload) and cannot join encrypted rooms.
import {Platform, RootViewModel, FeatureSet, createNavigation, createRouter} from "hydrogen-view-sdk";

const encryption = new URLSearchParams(location.search).get("e2ee") !== "off";
const assetPaths = {
    downloadSandbox: "assets/download-sandbox.html",
    worker: "assets/main.js",
    serviceWorker: "sw.js",
};
if (encryption) {
    assetPaths.olm = {wasm: "olm/olm.wasm", legacyBundle: "olm/olm_legacy.js", wasmBundle: "olm/olm.js"};
}

async function main() {
    const container = document.getElementById("app");
    const platform = new Platform({container, assetPaths, config: {}, options: {development: true}});
    await platform.init();
    const features = await FeatureSet.load(platform.settingsStorage);
    const navigation = createNavigation();
    platform.setNavigation(navigation);
    const urlRouter = createRouter({navigation, history: platform.history});
    urlRouter.attach();
    const vm = new RootViewModel({platform, urlRouter, navigation, features});
    await vm.load();
    platform.createAndMountRootView(vm);
    window.__hydrogenReady = true;
}

main().catch(err => {
    console.error(`${err.message}:\n${err.stack}`);
    document.body.setAttribute("data-start-error", err.message);
});
