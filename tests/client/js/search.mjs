// matrix-js-sdk and server-side search: alice makes a room whose history is visible only
// to joined members ("joined"), says "xylophone before bob", invites bob, bob joins, and
// alice says "xylophone after bob". Searching for "xylophone" through the SDK, bob finds
// only the later message (nor does the earlier one reach him as another result's
// context), and alice finds both.
// Usage: node search.mjs BASE_URL. Prints one JSON line; exits non-zero on failure.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { registeredClient } from "./accounts.mjs";
import { waitFor } from "./wait.mjs";

logger.setLevel("error");
const [baseUrl] = process.argv.slice(2);

function text(body) {
  return { msgtype: "m.text", body };
}

/** What the SDK made of a search: each result's event and the events the server gave as
 * its context (before and after: ID, type, state key). */
function summarised(searchResults) {
  return {
    count: searchResults.count ?? null,
    highlights: searchResults.highlights,
    results: searchResults.results.map((sr) => {
      const event = sr.context.getEvent();
      return {
        event_id: event.getId(),
        room_id: event.getRoomId(),
        sender: event.getSender(),
        body: event.getContent().body,
        context: sr.context
          .getTimeline()
          .filter((e) => e.getId() !== event.getId())
          .map((e) => [e.getId(), e.getType(), e.getStateKey() ?? null]),
      };
    }),
  };
}

async function main() {
  const alice = await registeredClient(baseUrl, "alice");
  const bob = await registeredClient(baseUrl, "bob");
  const { room_id: roomId } = await alice.createRoom({
    preset: "private_chat",
    // A name without the term: the room's name is searchable too (m.room.name).
    name: "music",
    initial_state: [
      {
        type: "m.room.history_visibility",
        state_key: "",
        content: { history_visibility: "joined" },
      },
    ],
  });
  const { event_id: before } = await alice.sendEvent(
    roomId,
    "m.room.message",
    text("xylophone before bob"),
  );
  await alice.invite(roomId, bob.getUserId());
  await bob.joinRoom(roomId);
  const { event_id: after } = await alice.sendEvent(
    roomId,
    "m.room.message",
    text("xylophone after bob"),
  );

  // Bob's live client has the later message: the server has stored (and indexed) it.
  const synced = waitFor(bob, "the first sync", () => bob.isInitialSyncComplete());
  await bob.startClient({ initialSyncLimit: 20 });
  await synced;
  await waitFor(bob, "the later message", () => bob.getRoom(roomId)?.findEventById(after));
  const bobTimeline = bob
    .getRoom(roomId)
    .getLiveTimeline()
    .getEvents()
    .map((e) => e.getId());

  // searchRoomEvents: order_by recent, one event of context either side, profiles.
  const bobSearch = summarised(await bob.searchRoomEvents({ term: "xylophone" }));
  const aliceSearch = summarised(await alice.searchRoomEvents({ term: "xylophone" }));
  // The raw call, ranked (the default order).
  const ranked = await bob.search({
    body: { search_categories: { room_events: { search_term: "xylophone" } } },
  });
  bob.stopClient();

  const rankedEvents = ranked.search_categories.room_events;
  console.log(
    JSON.stringify({
      room_id: roomId,
      alice: alice.getUserId(),
      bob: bob.getUserId(),
      before,
      after,
      bob_timeline_has_before: bobTimeline.includes(before),
      bob_search: bobSearch,
      alice_search: aliceSearch,
      bob_ranked: {
        count: rankedEvents.count ?? null,
        results: rankedEvents.results.map((r) => r.result.event_id),
      },
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
