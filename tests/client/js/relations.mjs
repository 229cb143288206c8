// matrix-js-sdk and relations: alice writes a thread (a root and replies), edits the root
// (m.replace) and reacts to it (m.annotation); bob, syncing with thread support, sees the
// replies in the root's thread, the edit applied to the root, and the reaction in the
// room's relations; a client of bob's started afterwards gets the root with the server's
// thread summary (unsigned m.relations m.thread) and the reaction through /relations.
// Usage: node relations.mjs BASE_URL. Prints one JSON line; exits non-zero on failure.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { registeredClient, loggedInClient } from "./accounts.mjs";
import { waitFor } from "./wait.mjs";

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

async function main() {
  const alice = await registeredClient(baseUrl, "alice");
  const bob = await registeredClient(baseUrl, "bob");
  const { room_id: roomId } = await alice.createRoom({ preset: "public_chat", name: "threads" });
  await bob.joinRoom(roomId);
  await started(bob);

  const { event_id: rootId } = await alice.sendEvent(roomId, "m.room.message", text("root"));
  const replies = [];
  for (const body of ["first reply", "second reply"]) {
    const sent = await alice.sendEvent(roomId, "m.room.message", text(body, thread(rootId)));
    replies.push(sent.event_id);
  }
  const { event_id: bobReply } = await bob.sendEvent(
    roomId,
    "m.room.message",
    text("bob's reply", thread(rootId)),
  );
  replies.push(bobReply);
  await alice.sendEvent(roomId, "m.room.message", {
    ...text("* root (edited)"),
    "m.new_content": text("root (edited)"),
    "m.relates_to": { rel_type: "m.replace", event_id: rootId },
  });
  const { event_id: reactionId } = await alice.sendEvent(roomId, "m.reaction", {
    "m.relates_to": { rel_type: "m.annotation", event_id: rootId, key: "👍" },
  });

  // What bob's live client makes of it.
  const room = bob.getRoom(roomId);
  const liveThread = await waitFor(bob, "the thread's three replies", () => {
    const found = room.getThread(rootId);
    const ids = found?.timeline.map((e) => e.getId()) ?? [];
    // Its length is the client's reply count (the server's count, then live replies).
    const complete = replies.every((id) => ids.includes(id)) && found.length === replies.length;
    return complete ? found : null;
  });
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
