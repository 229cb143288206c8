// matrix-js-sdk and the media repository: one user uploads an image (uploadContent) and
// sends it to a room as m.image; the other, syncing, receives the event and downloads the
// image and a thumbnail through the authenticated endpoints (mxcUrlToHttp with
// useAuthentication, the access token in the Authorization header, as Element does).
// Usage: node media.mjs BASE_URL IMAGE_PATH OUT_DIR. Writes OUT_DIR/download.bin and
// OUT_DIR/thumbnail.bin; prints one JSON line; exits non-zero on the first failure.
import { readFile, writeFile } from "node:fs/promises";
import { logger } from "matrix-js-sdk/lib/logger.js";
import { ClientEvent, RoomEvent } from "matrix-js-sdk";
import { registeredClient } from "./accounts.mjs";

logger.setLevel("error");
const [baseUrl, imagePath, outDir] = process.argv.slice(2);
const WAIT_MS = 30000;

async function fetchMedia(client, url) {
  const response = await fetch(url, {
    headers: { Authorization: `Bearer ${client.getAccessToken()}` },
  });
  if (response.status !== 200) {
    throw new Error(`GET ${url}: ${response.status} ${await response.text()}`);
  }
  return {
    bytes: Buffer.from(await response.arrayBuffer()),
    type: response.headers.get("content-type"),
    disposition: response.headers.get("content-disposition"),
  };
}

function waitForImage(client, roomId) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out waiting for the image")), WAIT_MS);
    client.on(RoomEvent.Timeline, (event, room) => {
      if (room?.roomId === roomId && event.getContent().msgtype === "m.image") {
        clearTimeout(timer);
        resolve(event);
      }
    });
  });
}

async function main() {
  const sender = await registeredClient(baseUrl, "sender");
  const viewer = await registeredClient(baseUrl, "viewer");
  const { room_id: roomId } = await sender.createRoom({ preset: "public_chat", name: "pictures" });
  await viewer.joinRoom(roomId);

  const image = await readFile(imagePath);
  const uploaded = await sender.uploadContent(new Blob([image], { type: "image/png" }), {
    name: "picture.png",
    type: "image/png",
  });
  const mxc = uploaded.content_uri;

  const synced = new Promise((resolve) => {
    viewer.once(ClientEvent.Sync, (state) => resolve(state));
  });
  const received = waitForImage(viewer, roomId);
  viewer.startClient({ initialSyncLimit: 10 });
  await synced;
  await sender.sendMessage(roomId, {
    msgtype: "m.image",
    body: "picture.png",
    url: mxc,
    info: { mimetype: "image/png", size: image.length },
  });
  const event = await received;
  const url = event.getContent().url;

  const download = await fetchMedia(viewer, viewer.mxcUrlToHttp(url, undefined, undefined, undefined, false, true, true));
  const thumbnail = await fetchMedia(viewer, viewer.mxcUrlToHttp(url, 96, 96, "crop", false, true, true));
  await writeFile(`${outDir}/download.bin`, download.bytes);
  await writeFile(`${outDir}/thumbnail.bin`, thumbnail.bytes);
  viewer.stopClient();
  console.log(
    JSON.stringify({
      mxc,
      received_url: url,
      download_type: download.type,
      download_disposition: download.disposition,
      thumbnail_type: thumbnail.type,
      download_url: viewer.mxcUrlToHttp(url, undefined, undefined, undefined, false, true, true),
    }),
  );
  process.exit(0);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
