"""The built-in web UI in a real headless browser: Debian's Chromium driven by
playwright's Python package (pointed at the system browser), against a real
server process.

The page is loaded through `Relay`, a TCP relay in this process that can
pause or cut the next chat answer's response after a given number of bytes.
That makes "mid-answer" exact whatever the machine's speed: the page has
rendered part of the answer and no more when the test reloads it or the
connection drops.  Every finished answer is compared with an uninterrupted
streamed request of the very body the page sent (captured from the browser),
greedy (--ui-config sets temperature 0), so a resume that lost, repeated or
reordered a byte fails.

Skipped, saying why, without playwright or a Chromium executable (.ci/run
installs Debian's `chromium`; MLXCEL_CHROMIUM names another binary).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import threading
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.conftest import wait_until

from .sse import iter_sse_lines

pytestmark = pytest.mark.e2e

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

CHROMIUM = os.environ.get("MLXCEL_CHROMIUM") or next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
if sync_playwright is None:
    pytest.skip("playwright's Python package is not installed (pip install -e '.[test]')",
                allow_module_level=True)
if CHROMIUM is None:
    pytest.skip("no Chromium executable: install Debian's chromium package (.ci/run does) "
                "or set MLXCEL_CHROMIUM", allow_module_level=True)

SHORT = 64       # tokens per answer unless a test asks for more (--ui-config max_tokens)
LONG = 1500      # an answer still generating long after the test acted on it
UI_CONFIG = {"temperature": 0, "max_tokens": SHORT}
PAUSE_AT = 3000  # response bytes (head included) the page gets before a pause or a cut
WAIT_MS = 30_000
CHAT = "v1/chat/completions"
LAST = "#messages article.assistant:last-of-type"


class Relay:
    """127.0.0.1 TCP relay to `port`.  `pause_after(n)` applies to the next
    POST /v1/chat/completions seen on any connection: after n bytes of its
    response the relay stops forwarding (`paused` is set) until `release()`
    (forwarding goes on) or `cut()` (both sides of that connection are reset,
    as a dropped network does; the page has applied what it got before)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.paused = threading.Event()
        self._released = threading.Event()
        self._cut = False
        self._plan: int | None = None
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def pause_after(self, n: int) -> None:
        with self._lock:
            self._plan = n
            self.paused.clear()
            self._released.clear()
            self._cut = False

    def release(self) -> None:
        self._released.set()

    def cut(self) -> None:
        self._cut = True
        self._released.set()

    def close(self) -> None:
        self._released.set()
        self.listener.close()
        for s in self._socks:
            _close(s)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            self._socks += [client, server]
            state: dict = {}
            threading.Thread(target=self._upstream, args=(client, server, state),
                             daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, state),
                             daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                if data.startswith(b"POST /" + CHAT.encode()):
                    with self._lock:
                        if self._plan is not None:
                            state["plan"], state["sent"], self._plan = self._plan, 0, None
                server.sendall(data)
        except OSError:
            pass
        _close(server)

    def _downstream(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            while data := server.recv(65536):
                after = state.get("plan")
                if after is not None:
                    room = after - state["sent"]
                    state["sent"] += len(data)
                    if len(data) >= room:
                        state["plan"] = None
                        client.sendall(data[:room])
                        self.paused.set()
                        self._released.wait(WAIT_MS / 1000)
                        if self._cut:
                            for s in (client, server):
                                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                             struct.pack("ii", 1, 0))
                            break
                        data = data[room:]
                client.sendall(data)
        except OSError:
            pass
        _close(client)
        _close(server)


def _close(s: socket.socket) -> None:
    """shutdown first: it wakes the other thread's recv on this socket,
    which close alone would leave blocked (and the connection open)."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


# ---- fixtures --------------------------------------------------------------------

@pytest.fixture(scope="module")
def servers(tiny_model, start_server) -> dict:
    """The module's three servers: the main one first, then the two the last
    tests use, which start while the first tests run; a test waits (bounded)
    for the one it uses."""
    out = {"ui": start_server(tiny_model, "-c", "4096", "-np", "2",
                              "--ui-config", json.dumps(UI_CONFIG))}
    out["key"] = start_server(tiny_model, "-np", "1", "--api-key", "s3cret", "--api-prefix",
                              "/llm", "--ui-config",
                              json.dumps({"temperature": 0, "max_tokens": 8}), wait_ready=False)
    out["no_ui"] = start_server(tiny_model, "-np", "1", "--no-ui", wait_ready=False)
    # the server's own sampling defaults and no --ui-config: the page must not override them
    out["defaults"] = start_server(tiny_model, "-np", "1", "--temp", "0.1", "--top-k", "5",
                                   "-n", "8", wait_ready=False)
    yield out
    for srv in out.values():
        srv.stop()


@pytest.fixture(scope="module")
def ui_server(servers):
    return servers["ui"]


@pytest.fixture(scope="module")
def relay(ui_server):
    r = Relay(ui_server.port)
    yield r
    r.close()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM,
                               args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


class Page:
    """One fresh browser context (its own localStorage) on one page, with
    every request and console error it saw."""

    def __init__(self, browser, url: str) -> None:
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.requests: list = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.set_default_timeout(WAIT_MS)
        self.page.goto(url + "/")

    def ready(self) -> None:
        # selectors, not wait_for_function: the page's CSP forbids the eval it uses
        self.page.wait_for_selector("#send:not([disabled])")

    def send(self, text: str) -> None:
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")

    def stored(self) -> list[dict]:
        """The conversations as the page keeps them, newest first."""
        return self.page.evaluate("JSON.parse(localStorage.getItem('mlxcel.conversations'))")

    def answer(self) -> dict:
        """The last answer as the page stored it (text, byte offset, state)."""
        current = self.page.evaluate("localStorage.getItem('mlxcel.current')")
        conv = next(c for c in self.stored() if c["id"] == current)
        return [m for m in conv["messages"] if m["role"] == "assistant"][-1]

    def wait_state(self, state: str) -> dict:
        try:
            self.page.wait_for_selector(f'{LAST}[data-state="{state}"]')
        except PlaywrightTimeout:
            last = self.answer()
            raise AssertionError(
                f"the answer never reached state {state!r}: state {last['state']!r}, "
                f"error {last.get('error')!r}, status {self.page.text_content('#status')!r}, "
                f"offset {last['offset']}, requests {[r.url for r in self.requests]}, "
                f"console {self.errors}") from None
        return self.answer()

    def chat_bodies(self) -> list[dict]:
        return [r.post_data_json for r in self.requests
                if r.method == "POST" and r.url.endswith("/" + CHAT)]

    def resumes(self, sid: str) -> list[int]:
        """The `from` offsets of the page's GET /v1/stream for `sid`."""
        out = []
        for r in self.requests:
            parts = urlsplit(r.url)
            q = parse_qs(parts.query)
            if r.method == "GET" and parts.path.endswith("/v1/stream") and q["conv_id"] == [sid]:
                out.append(int(q["from"][0]))
        return out

    def settings(self, **values: str) -> None:
        self.page.click("#settings-open")
        for key, value in values.items():
            self.page.fill(f"#set-{key}", value)
        self.page.click("#settings-save")
        self.page.wait_for_selector("#settings", state="hidden")

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_page(browser):
    pages: list[Page] = []

    def _open(url: str) -> Page:
        pages.append(Page(browser, url))
        return pages[-1]

    yield _open
    for p in pages:
        p.close()


def uninterrupted(url: str, body: dict) -> str:
    """The answer's text from a plain streamed request of the same body."""
    text = ""
    with httpx.Client(timeout=60) as c, c.stream("POST", f"{url}/{CHAT}", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in iter_sse_lines(r):
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    return text


def lookup(url: str, sid: str) -> list[dict]:
    r = httpx.post(url + "/v1/streams/lookup", json={"conversation_ids": [sid]})
    assert r.status_code == 200
    return r.json()


def slots_idle(url: str) -> bool:
    return not any(s["is_processing"] for s in httpx.get(url + "/slots").json())


# ---- tests -------------------------------------------------------------------------

def test_a_message_streams_into_the_page(ui_server, relay, open_page, tmp_path):
    p = open_page(relay.url)
    p.ready()
    assert p.page.text_content("#model-name") == ui_server.argv[4].rstrip("/").rsplit("/", 1)[1]
    assert p.page.text_content("#model-ctx") == "context 2048"
    assert p.page.is_hidden("#attach-label")  # a text-only model: nothing to attach
    relay.pause_after(PAUSE_AT)
    p.send("Tell me about the engine.")
    assert relay.paused.wait(WAIT_MS / 1000), "the answer never started"
    p.page.wait_for_selector(f"{LAST} .content:not(:empty)")
    partial = p.answer()
    assert partial["state"] == "streaming" and partial["content"] and partial["offset"] < PAUSE_AT
    assert p.page.is_visible("#stop") and p.page.is_disabled("#send")
    relay.release()
    done = p.wait_state("done")
    (body,) = p.chat_bodies()
    assert body["temperature"] == 0 and body["max_tokens"] == SHORT and body["stream"] is True
    assert done["content"].startswith(partial["content"])
    assert done["content"] == uninterrupted(ui_server.url, body)
    assert p.page.text_content(f"{LAST} .meta").startswith(f"{SHORT} tokens · ")
    assert "tokens/s" in p.page.text_content(f"{LAST} .meta")
    assert p.page.text_content("#conv-list li.current .title") == "Tell me about the engine."
    p.page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
    assert (tmp_path / "chat.png").stat().st_size > 0
    assert not p.errors, p.errors   # a CSP violation or a script error is logged here


def test_reload_mid_answer_resumes_to_the_uninterrupted_text(ui_server, relay, open_page):
    p = open_page(relay.url)
    p.ready()
    relay.pause_after(PAUSE_AT)
    p.send("Tell me a story about the engine.")
    assert relay.paused.wait(WAIT_MS / 1000), "the answer never started"
    p.page.wait_for_selector(f"{LAST} .content:not(:empty)")
    before = p.answer()
    assert before["state"] == "streaming" and 0 < before["offset"] < PAUSE_AT
    p.page.reload()
    relay.release()
    done = p.wait_state("done")
    (offset,) = p.resumes(before["sid"])   # what it had applied: maybe more than `before`
    assert before["offset"] <= offset < PAUSE_AT
    (body,) = p.chat_bodies()
    assert done["content"] == uninterrupted(ui_server.url, body)
    assert len(done["content"]) > len(before["content"])


def test_a_dropped_connection_recovers(ui_server, relay, open_page):
    p = open_page(relay.url)
    p.ready()
    relay.pause_after(PAUSE_AT)
    p.send("Tell me a story about the relay.")
    assert relay.paused.wait(WAIT_MS / 1000), "the answer never started"
    p.page.wait_for_selector(f"{LAST} .content:not(:empty)")
    before = p.answer()
    relay.cut()
    done = p.wait_state("done")
    (offset,) = p.resumes(done["sid"])
    assert 0 < before["offset"] <= offset < PAUSE_AT
    (body,) = p.chat_bodies()
    assert done["content"] == uninterrupted(ui_server.url, body)
    assert p.page.text_content("#status") == ""


def test_stop_cancels_the_generation(ui_server, relay, open_page):
    p = open_page(relay.url)
    p.ready()
    p.settings(max_tokens=str(LONG))
    relay.pause_after(PAUSE_AT)
    p.send("Go on for a long time.")
    assert relay.paused.wait(WAIT_MS / 1000), "the answer never started"
    p.page.wait_for_selector(f"{LAST} .content:not(:empty)")
    sid = p.answer()["sid"]
    (info,) = lookup(ui_server.url, sid)
    assert info["is_done"] is False, "the generation ended before the test could stop it"
    with p.page.expect_response(lambda r: r.request.method == "DELETE") as deleted:
        p.page.click("#stop")
    assert deleted.value.status == 204 and deleted.value.url.endswith(f"conv_id={sid}")
    relay.release()
    stopped = p.wait_state("stopped")
    assert lookup(ui_server.url, sid) == []          # DELETE evicted the session
    wait_until(lambda: slots_idle(ui_server.url), "every slot idle after Stop", timeout=10)
    assert p.page.text_content(f"{LAST} .meta") == "stopped"
    assert p.chat_bodies()[0]["max_tokens"] == LONG
    assert p.answer()["content"] == stopped["content"] and len(stopped["content"]) > 0
    assert p.page.is_visible("#send") and not p.page.is_visible("#stop")


def test_stop_before_the_answer_starts_still_cancels(ui_server, relay, open_page):
    """Stop pressed while the request's headers are still on their way: a
    DELETE sent then could reach the server before the session exists, so
    the page sends it once the headers arrive."""
    p = open_page(relay.url)
    p.ready()
    p.settings(max_tokens=str(LONG))
    relay.pause_after(1)
    p.send("Go on for a long time.")
    assert relay.paused.wait(WAIT_MS / 1000), "the request never reached the server"
    p.page.click("#stop")
    sid = p.wait_state("stopped")["sid"]
    (info,) = lookup(ui_server.url, sid)
    assert info["is_done"] is False
    assert not [r for r in p.requests if r.method == "DELETE"]
    with p.page.expect_response(lambda r: r.request.method == "DELETE") as deleted:
        relay.release()
    assert deleted.value.status == 204 and deleted.value.url.endswith(f"conv_id={sid}")
    assert lookup(ui_server.url, sid) == []
    wait_until(lambda: slots_idle(ui_server.url), "every slot idle after Stop", timeout=10)
    assert p.answer()["content"] == ""


def test_an_error_answer_is_shown(relay, open_page):
    p = open_page(relay.url)
    p.ready()
    p.settings(customJson=json.dumps({"temperature": "hot"}))
    p.send("Hello")
    failed = p.wait_state("error")
    assert failed["error"] == ("Field 'temperature': [json.exception.type_error.302] type must "
                               "be number, but is string")
    assert p.page.text_content(f"{LAST} .error") == failed["error"]
    assert p.page.is_enabled("#send")


def test_markup_in_an_answer_is_shown_as_text(ui_server, relay, open_page):
    """The model is made to answer markup (a grammar admits only this text):
    it must appear as characters, and only Markdown makes elements."""
    markup = ("<script>window.__xss=1</script><img src=x onerror=window.__xss=2> **bold** "
              "<b>b</b> [x](javascript:alert(1))")
    grammar = "root ::= " + json.dumps(markup)
    p = open_page(relay.url)
    p.ready()
    p.settings(customJson=json.dumps({"grammar": grammar, "max_tokens": 200}))
    p.send("Say it.")
    done = p.wait_state("done")
    assert done["content"] == markup
    content = p.page.locator(f"{LAST} .content")
    assert content.text_content() == ("<script>window.__xss=1</script>"
                                      "<img src=x onerror=window.__xss=2> bold <b>b</b> "
                                      "[x](javascript:alert(1))")
    tags = content.evaluate("el => [...el.querySelectorAll('*')].map(n => n.tagName)")
    assert tags == ["P", "STRONG"]
    assert p.page.evaluate("window.__xss") is None
    assert not p.errors, p.errors


def test_markdown_builds_only_its_own_elements(relay, open_page, tmp_path):
    """An imported answer with Markdown and markup: the structure comes from
    Markdown alone, every character of the markup stays text, and a link
    keeps its target only for http(s)."""
    answer = "\n".join([
        "# Title <i>x</i>", "", "Some `<b>code</b>` and *it* and [ok](https://example.org/a)",
        "and [bad](javascript:alert(1)).", "", "- one <u>1</u>", "- two", "",
        "1. first", "", "> quoted <script>x</script>", "", "```html",
        "<img src=x onerror=alert(1)>", "```"])
    doc = {"format": "mlxcel-trio-conversations", "version": 1, "conversations": [
        {"title": "<i>md</i>", "messages": [{"role": "user", "content": "<b>q</b>"},
                                            {"role": "assistant", "content": answer,
                                             "state": "streaming"}]}]}
    path = tmp_path / "md.json"
    path.write_text(json.dumps(doc))
    p = open_page(relay.url)
    p.ready()
    p.page.set_input_files("#import-file", str(path))
    p.page.wait_for_selector(f"{LAST} .content h1")
    content = p.page.locator(f"{LAST} .content")
    tree = content.evaluate("""el => [...el.querySelectorAll('*')].map(n =>
        n.tagName + (n.tagName === 'A' ? '=' + n.getAttribute('href') : ''))""")
    assert tree == ["H1", "P", "CODE", "EM", "A=https://example.org/a", "BR", "UL", "LI", "LI",
                    "OL", "LI", "BLOCKQUOTE", "P", "PRE", "CODE"]
    assert p.page.text_content(f"{LAST} h1") == "Title <i>x</i>"
    assert p.page.text_content(f"{LAST} pre") == "<img src=x onerror=alert(1)>"
    assert "[bad](javascript:alert(1))" in content.text_content()
    assert p.page.text_content("#messages article.user .content") == "<b>q</b>"
    assert p.page.text_content("#conv-list li.current .title") == "<i>md</i>"
    # an imported answer is never resumed: it was not this page's stream
    assert p.answer()["state"] == "stopped" and not p.resumes(p.answer()["sid"])


def test_reasoning_is_shown_apart_and_collapsible(ui_server, relay, open_page):
    """An assistant prefill opens a thinking block and a budget of 3 tokens
    closes it (the request fields ride in Custom JSON), so the model really
    streams reasoning_content and then content."""
    p = open_page(relay.url)
    p.ready()
    custom = {"messages": [{"role": "user", "content": "Think first."},
                           {"role": "assistant", "content": "<think>\n"}],
              "reasoning_budget_tokens": 3, "reasoning_budget_message": " Enough thinking.",
              "max_tokens": 24}
    p.settings(customJson=json.dumps(custom))
    p.send("Think first.")
    done = p.wait_state("done")
    (body,) = p.chat_bodies()
    want = {"content": "", "reasoning": ""}
    with httpx.Client(timeout=60) as c, c.stream("POST", f"{ui_server.url}/{CHAT}", json=body) as r:
        for line in iter_sse_lines(r):
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    want["content"] += choice["delta"].get("content") or ""
                    want["reasoning"] += choice["delta"].get("reasoning_content") or ""
    assert want["reasoning"].endswith("Enough thinking.") and want["content"]
    assert (done["reasoning"], done["content"]) == (want["reasoning"], want["content"])
    details = p.page.locator(f"{LAST} details.reasoning")
    assert details.evaluate("d => d.open") is False          # collapsed once the answer came
    assert details.locator("div").text_content() == want["reasoning"]
    p.page.click(f"{LAST} details.reasoning summary")
    assert details.evaluate("d => d.open") is True
    assert want["reasoning"] not in p.page.text_content(f"{LAST} .content")


def test_conversations_are_kept_in_the_browser(ui_server, relay, open_page, tmp_path):
    p = open_page(relay.url)
    p.context.grant_permissions(["clipboard-read", "clipboard-write"])
    p.ready()
    p.settings(top_p="0.9", top_k="7", min_p="0.1", systemMessage="Be brief.")
    p.send("First question")
    first = p.wait_state("done")
    body = p.chat_bodies()[-1]
    assert (body["top_p"], body["top_k"], body["min_p"]) == (0.9, 7, 0.1)
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "First question"}]
    # regenerate: a new answer (a new stream) in place of the old one
    p.page.click(f"{LAST} button.regenerate")
    p.page.wait_for_selector(f'{LAST}[data-state="streaming"]', state="detached")
    again = p.wait_state("done")
    assert again["sid"] != first["sid"] and again["content"] == first["content"]  # greedy
    # copy
    p.page.click(f"{LAST} button.copy")
    assert p.page.evaluate("navigator.clipboard.readText()") == again["content"]
    # edit the question: what followed it is replaced
    p.page.click("#messages article.user button.edit")
    assert p.page.input_value("#input") == "First question"
    p.send("Second question")
    p.page.wait_for_selector(f'{LAST}[data-state="streaming"]', state="detached")
    p.wait_state("done")
    assert [m["content"] for m in p.stored()[0]["messages"]][0] == "Second question"
    assert len(p.stored()[0]["messages"]) == 2
    # a second conversation, a rename, an export, a delete, an import
    p.page.click("#new-chat")
    p.send("Another chat")
    p.wait_state("done")
    assert p.page.locator("#conv-list li").count() == 2
    p.page.once("dialog", lambda d: d.accept("Renamed <b>chat</b>"))
    p.page.click("#conv-list li:nth-child(2) button.rename")
    assert p.page.text_content("#conv-list li:nth-child(2) .title") == "Renamed <b>chat</b>"
    with p.page.expect_download() as download:
        p.page.click("#export")
    exported = tmp_path / "conversations.json"
    download.value.save_as(exported)
    doc = json.loads(exported.read_text())
    assert doc["format"] == "mlxcel-trio-conversations"
    assert [c["title"] for c in doc["conversations"]] == ["Another chat", "Renamed <b>chat</b>"]
    p.page.once("dialog", lambda d: d.accept())
    p.page.click("#conv-list li:nth-child(1) button.delete")
    assert [c["title"] for c in p.stored()] == ["Renamed <b>chat</b>"]
    p.page.set_input_files("#import-file", str(exported))
    p.page.wait_for_selector("#conv-list li:nth-child(3)")
    p.page.reload()
    p.ready()
    titles = [c["title"] for c in p.stored()]
    assert titles == ["Another chat", "Renamed <b>chat</b>", "Renamed <b>chat</b>"]
    assert [m["content"] for m in p.stored()[1]["messages"]] == \
        [m["content"] for m in doc["conversations"][1]["messages"]]
    assert p.page.locator("#conv-list li").count() == 3


def test_the_page_asks_for_the_api_key(servers, open_page):
    """With --api-key and --api-prefix /llm: the page loads from /llm/ without
    the key, asks for it, and calls the API under the prefix with it."""
    srv = servers["key"]
    srv.wait_ready()
    p = open_page(srv.url + "/llm")
    p.page.wait_for_selector("#key-prompt", state="visible")
    assert p.page.is_disabled("#send")
    p.page.fill("#key-input", "wrong")
    p.page.click("#key-save")
    p.page.wait_for_selector("#key-error", state="visible")
    assert "refused" in p.page.text_content("#key-error")
    p.page.fill("#key-input", "s3cret")
    p.page.click("#key-save")
    p.ready()
    assert p.page.is_hidden("#key-prompt")
    assert p.page.evaluate("localStorage.getItem('mlxcel.apiKey')") == "s3cret"
    p.send("Hi")
    done = p.wait_state("done")
    assert done["content"] and p.page.text_content(f"{LAST} .meta").startswith("8 tokens")
    (post,) = [r for r in p.requests if r.method == "POST"]
    assert post.headers["authorization"] == "Bearer s3cret"
    assert post.url == srv.url + "/llm/v1/chat/completions"
    assert all(r.url.startswith(srv.url + "/llm/") for r in p.requests)
    assert not any("s3cret" in r.url for r in p.requests)
    p.page.reload()   # the key stays in this browser: no prompt the second time
    p.ready()
    assert p.page.is_hidden("#key-prompt")


def test_no_ui_gives_upstreams_answer_at_root(servers, open_page):
    srv = servers["no_ui"]
    srv.wait_ready()
    srv.wait_for_text("the web UI is disabled")
    p = open_page(srv.url)
    assert json.loads(p.page.text_content("body")) == {
        "error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
    assert httpx.get(srv.url + "/props").json()["ui"] is False


SAMPLING = {"temperature", "top_p", "top_k", "min_p", "max_tokens", "n_predict", "typical_p",
            "repeat_penalty", "presence_penalty", "frequency_penalty", "seed"}


def test_the_page_sends_no_sampling_field_the_user_did_not_set(servers, open_page):
    """The server's --temp / --top-k apply to the page's chats until the user
    sets a value; the settings dialog shows the server's values from /props."""
    srv = servers["defaults"]
    srv.wait_ready()
    p = open_page(srv.url)
    p.ready()
    p.send("What is the default?")
    p.wait_state("done")
    (body,) = p.chat_bodies()
    assert not SAMPLING & set(body), body
    assert set(body) == {"messages", "stream"}, body
    p.page.click("#settings-open")
    assert p.page.input_value("#set-temperature") == ""
    assert p.page.get_attribute("#set-temperature", "placeholder") == "server: 0.1"
    assert p.page.get_attribute("#set-top_k", "placeholder") == "server: 5"
    p.page.click("#settings-close")
    p.settings(top_k="7")            # the one field the user changes is the one sent
    p.send("And now?")
    p.wait_state("done")
    body = p.chat_bodies()[-1]
    assert SAMPLING & set(body) == {"top_k"} and body["top_k"] == 7, body
    p.page.click("#settings-open")
    p.page.click("#settings-reset")  # back to the server's defaults: nothing sent again
    p.page.click("#settings-close")
    p.send("Once more")
    p.wait_state("done")
    assert not SAMPLING & set(p.chat_bodies()[-1])
    assert not p.errors, p.errors


def test_an_attached_image_goes_as_an_image_url_part(tiny_vlm_model, shared_server, open_page,
                                                    tmp_path):
    """/props reports modalities.vision: the composer offers images (not
    audio), and the picture goes ahead of the text as an OpenAI image_url
    data URL, which the server answers."""
    import base64

    from PIL import Image

    srv = shared_server(tiny_vlm_model, "-c", "1024", "-np", "1", "--ui-config",
                        json.dumps({"temperature": 0, "max_tokens": 8}))
    pic = tmp_path / "pic.png"
    Image.new("RGB", (24, 30), (200, 30, 60)).save(pic)
    p = open_page(srv.url)
    p.ready()
    p.page.wait_for_selector("#attach-label:not([hidden])")
    accept = p.page.get_attribute("#attach", "accept")
    assert "image/*" in accept and "audio" not in accept, accept
    p.page.set_input_files("#attach", str(pic))
    p.page.wait_for_selector("#pending img")
    p.send("What is in this picture?")
    p.wait_state("done")
    (user,) = [m for m in p.chat_bodies()[-1]["messages"] if m["role"] == "user"]
    url = "data:image/png;base64," + base64.b64encode(pic.read_bytes()).decode()
    assert user["content"] == [{"type": "image_url", "image_url": {"url": url}},
                               {"type": "text", "text": "What is in this picture?"}]
    assert p.page.is_hidden("#pending")
    assert p.page.get_attribute("#messages article.user img", "src") == url
    assert not p.errors, p.errors


def test_an_attached_clip_goes_as_an_input_audio_part(shared_server, open_page, tmp_path):
    """/props reports modalities.audio (the tiny Gemma 3n and its audio
    tower): the composer offers audio (not images), and the clip goes ahead
    of the text as an OpenAI input_audio part, its bytes in base64 and its
    format from the file, which the server answers."""
    import base64

    import numpy as np
    import soundfile as sf

    pytest.importorskip("mlx_vlm")
    from fixtures.build import ensure

    srv = shared_server(ensure("tiny-gemma3n"), "-c", "2048", "-np", "1", "--no-warmup",
                        "--ui-config", json.dumps({"temperature": 0, "max_tokens": 4}))
    clip = tmp_path / "tone.wav"
    rate = 16000
    t = np.arange(rate) / rate
    sf.write(clip, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate)
    p = open_page(srv.url)
    p.ready()
    p.page.wait_for_selector("#attach-label:not([hidden])")
    accept = p.page.get_attribute("#attach", "accept")
    assert ".wav" in accept and "image" not in accept, accept
    p.page.set_input_files("#attach", str(clip))
    p.page.wait_for_selector("#pending li")
    assert p.page.text_content("#pending li span") == "audio: tone.wav"
    p.send("What do you hear?")
    done = p.wait_state("done")
    (user,) = [m for m in p.chat_bodies()[-1]["messages"] if m["role"] == "user"]
    data = base64.b64encode(clip.read_bytes()).decode()
    assert user["content"] == [{"type": "input_audio",
                                "input_audio": {"data": data, "format": "wav"}},
                               {"type": "text", "text": "What do you hear?"}]
    assert done["content"] and done["state"] == "done"
    assert p.page.is_hidden("#pending")
    assert p.page.text_content("#messages article.user .attachments span") == "audio: tone.wav"
    assert not p.errors, p.errors


@pytest.fixture(scope="module")
def ui_router(tmp_path_factory, tiny_model):
    """Router mode over two copies of the tiny model, with the web UI."""
    from .test_router import Router

    root = tmp_path_factory.mktemp("ui-models")
    for name in ("alpha", "beta"):
        shutil.copytree(tiny_model, root / name)
    r = Router(root, "--models-max", "1", "-np", "1", "-c", "1024").start()
    yield r
    r.stop()


def test_router_mode_serves_the_page_with_a_model_picker(ui_router, open_page):
    """`/` answers in router mode, as upstream's UI does; the page lists the
    router's models and sends the one picked as the request's "model"
    (which routes it), remembering it for the next visit."""
    r = httpx.get(ui_router.url + "/", timeout=30)
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    p = open_page(ui_router.url)
    p.ready()
    p.page.wait_for_selector("#model-pick:not([hidden])")
    options = p.page.eval_on_selector_all("#model-pick option", "els => els.map(e => e.value)")
    assert options == ["alpha", "beta"], options
    p.page.select_option("#model-pick", "beta")
    p.settings(max_tokens="2")
    p.send("hi")
    p.wait_state("done")
    assert p.chat_bodies()[-1]["model"] == "beta", p.chat_bodies()
    assert ui_router.statuses()["beta"] == "loaded"
    assert p.page.evaluate("localStorage.getItem('mlxcel.model')") == "beta"
    assert not p.errors, p.errors


def test_router_mode_offers_attach_for_the_picked_models_modalities(open_page, tmp_path):
    """The picker reads each model's input_modalities from /v1/models (no
    model loads for it): picking the VLM offers images, the Gemma 3n audio,
    the text model nothing (an attachment the new pick cannot take is
    dropped); an image sent to the VLM goes through the router as an
    image_url part and is answered."""
    import base64

    from PIL import Image

    pytest.importorskip("mlx_vlm")
    from fixtures.build import ensure

    from .test_router import Router

    root = tmp_path / "models"
    for name, kind in (("pics", "tiny-vlm"), ("voice", "tiny-gemma3n"), ("words", "tiny")):
        shutil.copytree(ensure(kind), root / name)
    r = Router(root, "--models-max", "1", "-np", "1", "-c", "1024", "--no-warmup",
               "--ui-config", json.dumps({"temperature": 0, "max_tokens": 4})).start()
    try:
        pic = tmp_path / "pic.png"
        Image.new("RGB", (24, 30), (200, 30, 60)).save(pic)
        p = open_page(r.url)
        p.ready()
        p.page.wait_for_selector("#model-pick:not([hidden])")
        assert p.page.input_value("#model-pick") == "pics"  # the first listed
        p.page.wait_for_selector("#attach-label:not([hidden])")
        accept = p.page.get_attribute("#attach", "accept")
        assert "image/*" in accept and "audio" not in accept, accept
        p.page.select_option("#model-pick", "words")
        p.page.wait_for_selector("#attach-label", state="hidden")
        p.page.select_option("#model-pick", "voice")
        p.page.wait_for_selector("#attach-label:not([hidden])")
        accept = p.page.get_attribute("#attach", "accept")
        assert ".wav" in accept and "image" not in accept, accept
        p.page.select_option("#model-pick", "pics")
        p.page.wait_for_selector("#attach-label:not([hidden])")
        p.page.set_input_files("#attach", str(pic))
        p.page.wait_for_selector("#pending img")
        p.page.select_option("#model-pick", "voice")  # takes no image: the pending one goes
        p.page.wait_for_selector("#pending", state="hidden")
        assert set(r.statuses().values()) == {"unloaded"}  # nothing loaded to decide
        p.page.select_option("#model-pick", "pics")
        p.page.set_input_files("#attach", str(pic))
        p.page.wait_for_selector("#pending img")
        p.send("What is in this picture?")
        p.wait_state("done")
        body = p.chat_bodies()[-1]
        url = "data:image/png;base64," + base64.b64encode(pic.read_bytes()).decode()
        (user,) = [m for m in body["messages"] if m["role"] == "user"]
        assert body["model"] == "pics" and user["content"] == [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is in this picture?"}]
        assert p.answer()["state"] == "done" and not p.answer().get("error")
        # the pick is remembered: a new visit starts on it, Attach as it allows
        p.page.select_option("#model-pick", "words")
        p.page.reload()
        p.ready()
        assert p.page.input_value("#model-pick") == "words"
        assert p.page.is_hidden("#attach-label")
        assert not p.errors, p.errors
    finally:
        r.stop()
