// Builds the page the browser tests serve into build/ (gitignored): index.html, the
// bundled main.js (esbuild), Hydrogen's service worker at the page's root (it must be
// served from the page's origin, at the path main.js registers), Hydrogen's assets
// (theme CSS and fonts, olm worker, download sandbox) and olm's wasm build.
import {build} from "esbuild";
import {cpSync, mkdirSync, rmSync} from "node:fs";
import {dirname, join} from "node:path";
import {fileURLToPath} from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, process.argv[2] ?? "build");
const modules = join(here, "node_modules");
rmSync(out, {recursive: true, force: true});
mkdirSync(join(out, "olm"), {recursive: true});
await build({
    entryPoints: [join(here, "page", "main.js")],
    bundle: true,
    format: "esm",
    target: "es2020",
    outfile: join(out, "main.js"),
    // olm.js (imported by the sdk) only reaches for these under Node.
    external: ["crypto", "path", "fs"],
    logLevel: "warning",
});
cpSync(join(here, "page", "index.html"), join(out, "index.html"));
cpSync(join(modules, "hydrogen-view-sdk", "lib-build", "sw.js"), join(out, "sw.js"));
cpSync(join(modules, "hydrogen-view-sdk", "asset-build", "assets"), join(out, "assets"), {recursive: true});
for (const file of ["olm.js", "olm.wasm", "olm_legacy.js"]) {
    cpSync(join(modules, "@matrix-org", "olm", file), join(out, "olm", file));
}
console.log(`built ${out}`);
