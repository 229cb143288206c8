"""Hydrogen (npm ``hydrogen-view-sdk``, its full web app) in headless Chromium against a real
``roomstream run`` process, on SQLite and PostgreSQL, the way a person uses it: two users
(registered through the API: Hydrogen has no registration screen) log in through the login
screen (homeserver, username, password), one creates a room and invites the other with
``/invite``, the other accepts, both chat live and read each other's messages in the page;
then one is away while 24 messages arrive (their next sync is limited, leaving a gap), comes
back and scrolls back through the gap (``/messages``) to the first message, and the other
reloads and scrolls back through its stored history. Both set a display name through the
API before logging in: the timeline shows each sender by that name, never by user ID.

Once without end-to-end encryption (olm left out of the page), once with it as Hydrogen
ships (olm loaded: device and one-time keys uploaded at login, the room created encrypted,
Megolm keys shared over to-device messages). The server must then only ever hold ciphertext.

Images (``test_hydrogen_image_*``): one user sends a picture through the composer's
attachment menu, and the other user's page renders it (a loaded ``<img>`` at the picture's
natural size): through the authenticated thumbnail endpoint, or, encrypted, downloaded and
decrypted by Hydrogen; the server holds the PNG, or ciphertext only.

On failure, a screenshot of every user's page is saved under ``test-artifacts/web/`` and
named in the failure. Every wait is a Playwright auto-waiting locator, ``expect``,
``wait_for_function`` or a long-polling ``/sync``; never a sleep.
"""

from __future__ import annotations

import io
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio
from PIL import Image
from playwright.async_api import Browser, BrowserContext, Locator, Page, expect

from tests.support.homeserver import RunningServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

ARTEFACTS = Path(__file__).parents[2] / "test-artifacts" / "web"
PASSWORD = "correct horse battery staple"
ROOM_NAME = "web chat"
HISTORY = [f"history {i:02d}" for i in range(24)]
# Hydrogen 0.3.1 runs `/invite <user>` and then also sends the command's text as a message
# (its command handler leaves the message in place): "/invite", then the chat.
CHAT = ["hello bob", "hello alice"]
MESSAGE_COUNT = 1 + len(CHAT) + len(HISTORY)
#: Display names set through the profile API before logging in.
DISPLAY_NAMES = {"alice": "Alice Liddell", "bob": "Bob Builder"}
# Hydrogen's own waits (first sync, key uploads, decryption) on a loaded two-core machine.
STEP_TIMEOUT_MS = 30_000
expect.set_options(timeout=STEP_TIMEOUT_MS)


@dataclass
class WebUser:
    """One person: their own browser context (storage, service worker) and page."""

    name: str
    context: BrowserContext
    page: Page
    user_id: str = ""
    access_token: str = ""


@dataclass
class WebRig:
    browser: Browser
    page_url: str
    server: RunningServer
    test_name: str
    encryption: bool = True
    users: list[WebUser] = field(default_factory=list)
    room_id: str = ""

    async def user(self, name: str) -> WebUser:
        """Registered through the API, with Hydrogen open on its login screen."""
        async with aiohttp.ClientSession() as session:
            body = {"username": name, "password": PASSWORD, "auth": {"type": "m.login.dummy"}}
            url = f"{self.server.url}/_matrix/client/v3/register"
            async with session.post(url, json=body) as resp:
                result = await resp.json()
                assert resp.status == 200, result
        context = await self.browser.new_context()
        context.set_default_timeout(STEP_TIMEOUT_MS)
        page = await context.new_page()
        user = WebUser(name, context, page, result["user_id"], result["access_token"])
        self.users.append(user)
        await page.goto(self.page_url + ("" if self.encryption else "?e2ee=off"))
        return user

    @asynccontextmanager
    async def screenshots_on_failure(self) -> AsyncIterator[None]:
        try:
            yield
        except BaseException as exc:
            folder = ARTEFACTS / re.sub(r"[^\w.-]+", "_", self.test_name)
            folder.mkdir(parents=True, exist_ok=True)
            saved = []
            for user in self.users:
                for number, page in enumerate(user.context.pages):
                    path = folder / f"{user.name}-{number}.png"
                    try:
                        await page.screenshot(path=str(path), full_page=True)
                        saved.append(str(path))
                    except Exception as shot_error:  # a closed page must not hide the failure
                        saved.append(f"{path}: not saved ({shot_error})")
            exc.add_note("screenshots: " + ", ".join(saved))
            raise

    async def close(self) -> None:
        """Close the browsers, then wake the long-polling /sync requests they left on the
        server with one more message, so that the server's shutdown does not wait up to
        Hydrogen's 30 s sync timeout for them (roomstream lets in-flight requests finish)."""
        for user in self.users:
            await user.context.close()
        if self.users and self.room_id:
            path = f"/rooms/{self.room_id}/send/m.room.message/bye"
            await self.api(self.users[0], path, "PUT", {"msgtype": "m.text", "body": "bye"})

    async def wait_for_messages(self, user: WebUser, count: int) -> None:
        """Until the chat room holds ``count`` messages on the server: each round that
        finds fewer waits in a long-polling /sync for the next event (no sleeps)."""
        since = (await self.api(user, "/sync?timeout=0"))["next_batch"]
        while len(await self.room_messages(user)) < count:
            since = (await self.api(user, f"/sync?timeout=30000&since={since}"))["next_batch"]

    async def room_messages(self, user: WebUser) -> list[dict[str, Any]]:
        """The messages (plain or encrypted) in the chat room, oldest first."""
        page = await self.api(user, f"/rooms/{self.room_id}/messages?dir=b&limit=100")
        kinds = ("m.room.message", "m.room.encrypted")
        return [event for event in reversed(page["chunk"]) if event["type"] in kinds]

    async def download(self, user: WebUser, uri: str) -> bytes:
        """An ``mxc://`` URI's bytes through the authenticated media endpoint."""
        server_name, media_id = uri.removeprefix("mxc://").split("/", 1)
        path = f"/_matrix/client/v1/media/download/{server_name}/{media_id}"
        async with aiohttp.ClientSession() as session:
            headers = {"Authorization": f"Bearer {user.access_token}"}
            async with session.get(self.server.url + path, headers=headers) as resp:
                body = await resp.read()
                assert resp.status == 200, (path, body[:200])
                return body

    async def api(self, user: WebUser, path: str, method: str = "GET", body: Any = None) -> Any:
        async with aiohttp.ClientSession() as session:
            url = f"{self.server.url}/_matrix/client/v3{path}"
            headers = {"Authorization": f"Bearer {user.access_token}"}
            async with session.request(method, url, headers=headers, json=body) as resp:
                result = await resp.json()
                assert resp.status == 200, (path, result)
                return result


@pytest_asyncio.fixture(loop_scope="session")
async def rig(
    browser: Browser,
    page_url: str,
    roomstream_server: RunningServer,
    request: pytest.FixtureRequest,
) -> AsyncIterator[WebRig]:
    rig = WebRig(browser, page_url, roomstream_server, request.node.name)
    try:
        yield rig
    finally:
        await rig.close()


# -- Hydrogen's UI, step by step --------------------------------------------------------


async def log_in(user: WebUser, homeserver: str) -> None:
    page = user.page
    homeserver_field = page.locator("#homeserver")
    await homeserver_field.fill(homeserver)
    # Hydrogen queries the homeserver's login flows when the field changes (on blur).
    await homeserver_field.press("Tab")
    await page.locator("#username").fill(user.name)
    await page.locator("#password").fill(PASSWORD)
    await page.get_by_role("button", name="Log In").click()
    # Either the session loads, or Hydrogen says why not (e.g. a failed /keys/upload).
    loaded = page.locator(".SessionView .RoomList")
    failed = page.locator(".SessionLoadStatusView").get_by_text("Something went wrong")
    await expect(loaded.or_(failed)).to_be_attached()
    assert await failed.count() == 0, await failed.first.text_content()


async def create_room(user: WebUser, name: str, *, encrypted: bool) -> None:
    page = user.page
    await page.get_by_role("button", name="Create room").click()
    await page.locator(".menu-item").get_by_text("Create Room", exact=True).click()
    await page.locator("#name").fill(name)
    await page.locator("#isEncrypted").set_checked(encrypted)
    await page.locator(".CreateRoomView").get_by_role("button", name="Create room").click()
    await page.locator(".RoomList").get_by_text(name, exact=True).click()
    await expect(page.locator(".RoomHeader h2")).to_have_text(name)


def composer(page: Page) -> Locator:
    return page.locator(".MessageComposer textarea")


async def send(user: WebUser, text: str) -> None:
    """Type and send; returns once the message shows in the sender's own timeline (its
    local echo: it may still be on its way to the server)."""
    await composer(user.page).fill(text)
    await composer(user.page).press("Enter")
    if not text.startswith("/"):
        await expect(message(user.page, text)).to_be_visible()


def senders(page: Page) -> Locator:
    """The sender names the timeline shows (one per group of a sender's messages)."""
    return page.locator(".Timeline_message .Timeline_messageSender")


def message(page: Page, text: str) -> Locator:
    """A message tile's body showing exactly ``text`` (the body also holds its time)."""
    exactly = re.compile("^" + re.escape(text) + r"\s*(\d{1,2}:\d{2}\s*[AP]M)?$")
    return page.locator(".Timeline_message .Timeline_messageBody").filter(has_text=exactly)


async def open_invite_and_accept(user: WebUser, room_name: str) -> None:
    page = user.page
    await page.locator(".RoomList").get_by_text(room_name, exact=True).click()
    await page.get_by_role("button", name="Accept").click()
    await expect(composer(page)).to_be_visible()


async def scroll_back_to(page: Page, text: str) -> None:
    """Scroll the timeline to its top until ``text`` is rendered: each poll scrolls again, so
    Hydrogen keeps filling gaps (``/messages``) and loading stored history until it shows."""
    await page.wait_for_function(
        """text => {
            const scroller = document.querySelector(".Timeline_scroller");
            // Up to the top, or a pixel down when already there: Hydrogen fills a gap
            // when a scroll event finds it in view, so every poll really scrolls.
            if (scroller) { scroller.scrollTop = scroller.scrollTop === 0 ? 1 : 0; }
            // Hydrogen 0.3.1 stops there once the tiles beside a gap were replaced by their
            // decrypted versions: scrolling no longer reaches the gap tile (its view holds
            // stale tiles), which keeps its next token and never asks for more. Telling the
            // gap tiles they are in view, as that scroll should have, resumes the filling.
            const timeline = window.__hydrogenViewModel?.sessionViewModel
                ?.currentRoomViewModel?.timelineViewModel;
            for (const tile of timeline ? timeline.tiles : []) {
                if (tile.shape === "gap" && !tile.isLoading) { tile.notifyVisible(); }
            }
            const shown = body => [...body.childNodes]
                .filter(node => node.nodeType !== Node.COMMENT_NODE && node.nodeName !== "TIME")
                .map(node => node.textContent).join("").trim();
            return [...document.querySelectorAll(".Timeline_messageBody")]
                .some(body => shown(body) === text);
        }""",
        arg=text,
        polling=100,
        timeout=STEP_TIMEOUT_MS,
    )
    await expect(message(page, text)).to_be_visible()


# -- the scenario ------------------------------------------------------------------------


async def chat_scenario(rig: WebRig, *, encryption: bool) -> None:
    rig.encryption = encryption
    alice = await rig.user("alice")
    bob = await rig.user("bob")
    for user in (alice, bob):
        path = f"/profile/{quote(user.user_id, safe='')}/displayname"
        await rig.api(user, path, "PUT", {"displayname": DISPLAY_NAMES[user.name]})
    await log_in(alice, rig.server.url)
    await log_in(bob, rig.server.url)

    await create_room(alice, ROOM_NAME, encrypted=rig.encryption)
    placeholder = "Send an encrypted message…" if rig.encryption else "Send a message…"
    await expect(composer(alice.page)).to_have_attribute("placeholder", placeholder)
    await send(alice, f"/invite {bob.user_id}")
    await open_invite_and_accept(bob, ROOM_NAME)
    # The room exists on the server now (Hydrogen lists a room while creating it).
    rooms = (await rig.api(alice, "/joined_rooms"))["joined_rooms"]
    assert len(rooms) == 1, rooms
    rig.room_id = rooms[0]
    await expect(composer(bob.page)).to_have_attribute("placeholder", placeholder)

    # Live, both ways: each sees the other's plaintext in the page.
    await send(alice, CHAT[0])
    await expect(message(bob.page, CHAT[0])).to_be_visible()
    await send(bob, CHAT[1])
    await expect(message(alice.page, CHAT[1])).to_be_visible()
    # Each sees the other by display name (their membership events carry the profile).
    await expect(senders(bob.page).filter(has_text=DISPLAY_NAMES["alice"]).first).to_be_visible()
    await expect(senders(alice.page).filter(has_text=DISPLAY_NAMES["bob"]).first).to_be_visible()
    for user in (alice, bob):
        shown = await senders(user.page).all_text_contents()
        assert shown and not [name for name in shown if "@" in name], shown

    # Bob is away while 24 messages arrive: more than a sync's timeline limit, so his next
    # sync is limited and the history before it comes from /messages when he scrolls back.
    bob_room_url = bob.page.url
    await bob.page.close()
    for text in HISTORY:
        await send(alice, text)
    await rig.wait_for_messages(alice, MESSAGE_COUNT)
    bob.page = await bob.context.new_page()
    await bob.page.goto(bob_room_url)
    await expect(message(bob.page, HISTORY[-1])).to_be_visible()
    # The gap lies between his stored "hello alice" and the synced tail: scrolling back to
    # the first message of the gap fills it.
    await scroll_back_to(bob.page, HISTORY[0])
    for text in CHAT:
        await expect(message(bob.page, text)).to_be_attached()

    # Alice reloads: her stored history, back to the first message.
    await alice.page.reload()
    await expect(message(alice.page, HISTORY[-1])).to_be_visible()
    await scroll_back_to(alice.page, CHAT[0])
    for text in (CHAT[1], HISTORY[0]):
        await expect(message(alice.page, text)).to_be_attached()

    await check_what_the_server_holds(rig, alice)


async def check_what_the_server_holds(rig: WebRig, user: WebUser) -> None:
    """Through the API: the room is encrypted exactly when Hydrogen said so, and then the
    server holds ciphertext only; otherwise the plaintext messages, in order."""
    state = await rig.api(user, f"/rooms/{rig.room_id}/state")
    encryption = [event for event in state if event["type"] == "m.room.encryption"]
    messages = await rig.room_messages(user)
    assert len(messages) == MESSAGE_COUNT
    if rig.encryption:
        assert [event["content"]["algorithm"] for event in encryption] == ["m.megolm.v1.aes-sha2"]
        assert {event["type"] for event in messages} == {"m.room.encrypted"}
        assert all(event["content"]["algorithm"] == "m.megolm.v1.aes-sha2" for event in messages)
        assert "hello" not in str(messages) and "history" not in str(messages)
    else:
        assert encryption == []
        bodies = [event["content"]["body"] for event in messages]
        assert bodies == [f"/invite @bob:{rig.server.server_name}", *CHAT, *HISTORY]


async def test_hydrogen_chat_unencrypted(rig: WebRig) -> None:
    async with rig.screenshots_on_failure():
        await chat_scenario(rig, encryption=False)


async def test_hydrogen_chat_encrypted(rig: WebRig) -> None:
    """As Hydrogen ships: needs the keys endpoints (/keys/upload, /keys/query,
    /keys/claim, to-device messages, device lists in /sync)."""
    async with rig.screenshots_on_failure():
        await chat_scenario(rig, encryption=True)


# -- an image, sent through Hydrogen's attachment menu -----------------------------------

#: Below Hydrogen's 400x300 tile (shown at its own size, so the thumbnail Hydrogen asks for
#: is the image's size) and its 600 px threshold for uploading a thumbnail of its own.
IMAGE_SIZE = (120, 80)


def picture_png() -> bytes:
    """A PNG whose pixels are not uniform (a broken decode or a wrong thumbnail would not
    keep its size)."""
    image = Image.new("RGB", IMAGE_SIZE, (200, 30, 30))
    for x in range(0, IMAGE_SIZE[0], 2):
        for y in range(0, IMAGE_SIZE[1], 3):
            image.putpixel((x, y), (x * 2 % 256, y * 3 % 256, 90))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


async def send_picture(user: WebUser, name: str, data: bytes) -> str:
    """The composer's attachment button, "Send picture", and the file chooser it opens;
    returns the ``mxc://`` URI the upload (``POST .../media/.../upload``) answered."""
    page = user.page
    async with page.expect_file_chooser() as chooser:
        await page.locator(".MessageComposer button.sendFile").click()
        await page.locator(".menu-item").get_by_text("Send picture", exact=True).click()
    uploaded = "/upload"
    async with page.expect_response(
        lambda r: r.request.method == "POST" and uploaded in r.url
    ) as upload:
        await (await chooser.value).set_files(
            files=[{"name": name, "mimeType": "image/png", "buffer": data}]
        )
    response = await upload.value
    assert response.status == 200, await response.text()
    uri: str = (await response.json())["content_uri"]
    return uri


async def rendered_image(page: Page, name: str) -> dict[str, Any]:
    """Waits until the timeline shows the image tile ``name`` with its picture loaded (an
    <img> that finished loading with a non-zero natural size); returns its src and size."""
    handle = await page.wait_for_function(
        """name => {
            const img = [...document.querySelectorAll(".Timeline_message img")]
                .find(img => img.getAttribute("alt") === name);
            if (!img || !img.src || !img.complete || img.naturalWidth === 0) { return null; }
            return {src: img.src, width: img.naturalWidth, height: img.naturalHeight};
        }""",
        arg=name,
        polling=100,
        timeout=STEP_TIMEOUT_MS,
    )
    result: dict[str, Any] = await handle.json_value()
    return result


async def image_scenario(rig: WebRig, *, encryption: bool) -> None:
    rig.encryption = encryption
    alice = await rig.user("alice")
    bob = await rig.user("bob")
    await log_in(alice, rig.server.url)
    await log_in(bob, rig.server.url)
    await create_room(alice, ROOM_NAME, encrypted=encryption)
    await send(alice, f"/invite {bob.user_id}")
    await open_invite_and_accept(bob, ROOM_NAME)
    rig.room_id = (await rig.api(alice, "/joined_rooms"))["joined_rooms"][0]

    data = picture_png()
    uri = await send_picture(alice, "picture.png", data)
    shown = await rendered_image(bob.page, "picture.png")
    assert (shown["width"], shown["height"]) == IMAGE_SIZE, shown
    if encryption:
        # Hydrogen downloads the ciphertext and shows the decrypted blob.
        assert shown["src"].startswith("blob:"), shown
    else:
        # The thumbnail Hydrogen asks for, through the authenticated media endpoint (its
        # service worker adds the access token).
        prefix = f"{rig.server.url}/_matrix/client/v1/media/thumbnail/{rig.server.server_name}/"
        assert shown["src"].startswith(prefix), shown

    # What the server holds: the file Hydrogen uploaded, byte for byte (plaintext), or
    # only ciphertext (the event's content is encrypted too).
    events = await rig.room_messages(bob)
    assert len(events) == 2, events  # "/invite ..." and the picture
    picture = events[-1]
    if encryption:
        assert picture["type"] == "m.room.encrypted"
        assert "picture.png" not in str(picture) and uri not in str(picture)
        media = await rig.download(bob, uri)
        assert media != data and len(media) == len(data)  # AES-CTR: same length
    else:
        content = picture["content"]
        assert content["msgtype"] == "m.image" and content["body"] == "picture.png"
        assert content["url"] == uri
        assert (content["info"]["w"], content["info"]["h"]) == IMAGE_SIZE
        assert content["info"]["mimetype"] == "image/png"
        assert await rig.download(bob, uri) == data


async def test_hydrogen_image_unencrypted(rig: WebRig) -> None:
    async with rig.screenshots_on_failure():
        await image_scenario(rig, encryption=False)


async def test_hydrogen_image_encrypted(rig: WebRig) -> None:
    """Hydrogen encrypts the file (an ``m.room.encrypted`` event whose ``file`` holds the
    key), uploads the ciphertext, and the other page downloads and decrypts it."""
    async with rig.screenshots_on_failure():
        await image_scenario(rig, encryption=True)
