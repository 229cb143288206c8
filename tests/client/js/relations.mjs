// matrix-js-sdk and relations: alice writes a thread (a root and replies), edits the root
// (m.replace) and reacts to it (m.annotation); bob, syncing with thread support, sees the
// replies in the root's thread, the edit applied to the root, and the reaction in the
// room's relations; a client of bob's started afterwards gets the root with the server's
// thread summary (unsigned m.relations m.thread) and the reaction through /relations.
// Usage: node relations.mjs BASE_URL. Prints one JSON line; exits non-zero on failure.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { registeredClient, loggedInClient } from "./accounts.mjs";
import { poll, waitFor } from "./wait.mjs";

logger.setLevel("error");
const [baseUrl] = process.argv.slice(2);

function text(body, relatesTo) {
  const content = { msgtype: "m.text", body };
  if (relatesTo) content["m.relates_to"] = relatesTo;
  return content;
}

function thread(rootId) {
  return { rel_type: "m.thread", event_id: rootId, is_falling_back: true };
}

async function started(client) {
  const synced = waitFor(client, "the first sync", () => client.isInitialSyncComplete());
  await client.startClient({ initialSyncLimit: 20, threadSupport: true });
  await synced;
}

// matrix-js-sdk keeps a thread's reply count itself: the server's count
// (unsigned m.relations m.thread) from its latest GET of the root, plus each reply that
// reaches the thread's timeline after that answer. It fetches the root when the thread
// appears, again on the first reply after the thread's first page of /relations, and on
// its own user's local echo. A reply persisted before such a GET is served but delivered
// by sync after the answer is processed is counted twice (seen: 4 for 3 replies, the
// third counted by the GET and then again by sync), and one delivered before an answer
// served ahead of it is lost; the client repairs neither until its next fetch. That is the
// client's race, whichever server answers, so the scenario waits, before each next reply,
// until bob's client holds this one and no GET of the root or page of /relations is in
// flight: then every GET is served after the replies it counts and before the next one.
let inFlight = 0;
async function counted(url, init) {
  const path = decodeURIComponent(String(url));
  const tracked = /\/rooms\/[^/]+\/(event|relations)\//.test(path);
  if (tracked) inFlight += 1;
  try {
    return await fetch(url, init);
  } finally {
    if (tracked) inFlight -= 1;
  }
}

async function settled(room, rootId, replies) {
  await poll(`bob's thread with ${replies.length} replies, settled`, () => {
    const found = room.getThread(rootId);
    const ids = found?.timeline.map((e) => e.getId()) ?? [];
    return (
      inFlight === 0 &&
      found?.initialEventsFetched &&
      replies.every((id) => ids.includes(id)) &&
      found.length === replies.length
    );
  }, 50);
}

async function main() {
  const alice = await registeredClient(baseUrl, "alice");
  const bob = await registeredClient(baseUrl, "bob", { fetchFn: counted });
  const { room_id: roomId } = await alice.createRoom({ preset: "public_chat", name: "threads" });
  await bob.joinRoom(roomId);
  await started(bob);

  const { event_id: rootId } = await alice.sendEvent(roomId, "m.room.message", text("root"));
  const room = bob.getRoom(roomId);
  // One reply at a time, each from a client other than bob's syncing one (bob's own reply
  // from his second device), and the next sent only once bob's client has settled: see
  // `settled`.
  const bobsPhone = await loggedInClient(baseUrl, "bob");
  const replies = [];
  for (const [sender, body] of [
    [alice, "first reply"],
    [alice, "second reply"],
    [bobsPhone, "bob's reply"],
  ]) {
    const sent = await sender.sendEvent(roomId, "m.room.message", text(body, thread(rootId)));
    replies.push(sent.event_id);
    await settled(room, rootId, replies);
  }
  await alice.sendEvent(roomId, "m.room.message", {
    ...text("* root (edited)"),
    "m.new_content": text("root (edited)"),
    "m.relates_to": { rel_type: "m.replace", event_id: rootId },
  });
  const { event_id: reactionId } = await alice.sendEvent(roomId, "m.reaction", {
    "m.relates_to": { rel_type: "m.annotation", event_id: rootId, key: "👍" },
  });

  // What bob's live client makes of it.
  const liveThread = room.getThread(rootId);
  const edited = await waitFor(bob, "the edit applied", () => {
    const body = room.findEventById(rootId)?.getContent().body;
    return body === "root (edited)" ? body : null;
  });
  const liveReactions = await waitFor(bob, "the reaction", () => {
    const relations = room.relations.getChildEventsForEvent(rootId, "m.annotation", "m.reaction");
    const sorted = relations?.getSortedAnnotationsByKey() ?? [];
    return sorted.length ? sorted.map(([key, events]) => [key, events.size]) : null;
  });
  const mainTimeline = room.getLiveTimeline().getEvents().map((e) => e.getId());
  bob.stopClient();

  // A client of bob's starting now: the root's thread summary comes from the server.
  const later = await loggedInClient(baseUrl, "bob");
  await started(later);
  const laterRoom = later.getRoom(roomId);
  const root = await waitFor(later, "the root", () => laterRoom.findEventById(rootId));
  const summary = root.getServerAggregatedRelation("m.thread");
  const fetched = await later.relations(roomId, rootId, "m.annotation", "m.reaction");
  const threadsPage = await later.http.authedRequest("GET", `/rooms/${encodeURIComponent(roomId)}/threads`);
  later.stopClient();

  console.log(
    JSON.stringify({
      root: rootId,
      replies,
      reaction: reactionId,
      live_thread_replies: liveThread.timeline
        .map((e) => e.getId())
        .filter((id) => id !== rootId),
      live_thread_length: liveThread.length,
      replies_in_main_timeline: replies.filter((id) => mainTimeline.includes(id)).length,
      edited_body: edited,
      live_reactions: liveReactions,
      summary_count: summary?.count ?? null,
      summary_latest: summary?.latest_event?.event_id ?? null,
      summary_participated: summary?.current_user_participated ?? null,
      later_root_body: root.getContent().body,
      fetched_reactions: fetched.events.map((e) => [e.getId(), e.getRelation()?.key]),
      threads: threadsPage.chunk.map((e) => e.event_id),
    }),
  );
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
