// Opens a file in headless Chromium as a user does and reports what the page shows, driving
// the browser through its DevTools protocol over a pipe (`--remote-debugging-pipe`: JSON
// messages ended by a NUL byte, read on fd 3 and written on fd 4 of the browser), so that no
// port is opened and no WebSocket client is needed. Prints one JSON object on stdout; every
// uncaught exception and console error of the page is in its `errors`.
//
//   node chromium.js dhat VIEWER_HTML FILE
//     opens Valgrind's DHAT viewer (dh_view.html), picks FILE in its file input (the "Load…"
//     button's), waits for the tree and prints the page's text: {text, errors}
//   node chromium.js flamegraph SVG TERM TOOLTIP
//     opens the flame graph, clicks Search and answers its prompt with TERM, then moves the
//     mouse over the frame whose tooltip (<title>) starts with TOOLTIP:
//     {errors, matched, fills (each frame's fill after the search, by name), details}
"use strict";
const { spawn } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");

const [mode, page, ...rest] = process.argv.slice(2);
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "memtrack-chromium-"));
const browser = spawn(
  process.env.CHROMIUM || "chromium",
  [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-breakpad",
    "--lang=en-US",
    "--window-size=1400,1000",
    `--user-data-dir=${profile}`,
    "--remote-debugging-pipe",
    "about:blank",
  ],
  { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"], env: { ...process.env, LANG: "en_US.UTF-8" } }
);
let stderr = "";
browser.stderr.on("data", (d) => (stderr += d));
const toBrowser = browser.stdio[3];
const fromBrowser = browser.stdio[4];

// Closes the browser (killed if it does not exit within 5 s), removes its profile and exits.
function finish(code, out) {
  if (out !== undefined) console.log(JSON.stringify(out));
  browser.on("exit", () => {
    fs.rmSync(profile, { recursive: true, force: true });
    process.exit(code);
  });
  if (browser.exitCode !== null || browser.signalCode !== null) browser.emit("exit");
  toBrowser.write(JSON.stringify({ id: 0, method: "Browser.close", params: {} }) + "\0");
  setTimeout(() => browser.kill("SIGKILL"), 5000).unref();
}

const timer = setTimeout(() => {
  console.error(`chromium.js: no answer in 30 s; the browser said:\n${stderr}`);
  finish(2);
}, 30000);

let nextId = 1;
const pending = new Map();
const listeners = [];
let buffered = "";
fromBrowser.on("data", (chunk) => {
  buffered += chunk.toString("utf8");
  let end;
  while ((end = buffered.indexOf("\0")) >= 0) {
    const msg = JSON.parse(buffered.slice(0, end));
    buffered = buffered.slice(end + 1);
    if (msg.id !== undefined && pending.has(msg.id)) {
      const { resolve, reject, method } = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) reject(new Error(`${method}: ${JSON.stringify(msg.error)}`));
      else resolve(msg.result);
    } else if (msg.method) {
      for (const l of listeners) l(msg);
    }
  }
});

function send(method, params = {}, sessionId) {
  const id = nextId++;
  const msg = { id, method, params };
  if (sessionId) msg.sessionId = sessionId;
  toBrowser.write(JSON.stringify(msg) + "\0");
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject, method }));
}

function once(method, sessionId) {
  return new Promise((resolve) => {
    const l = (msg) => {
      if (msg.method === method && msg.sessionId === sessionId) {
        listeners.splice(listeners.indexOf(l), 1);
        resolve(msg.params);
      }
    };
    listeners.push(l);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A page of its own, its errors collected, loaded from `url`.
async function open(url) {
  const { targetId } = await send("Target.createTarget", { url: "about:blank" });
  const { sessionId } = await send("Target.attachToTarget", { targetId, flatten: true });
  const errors = [];
  listeners.push((msg) => {
    if (msg.sessionId !== sessionId) return;
    if (msg.method === "Runtime.exceptionThrown") {
      const d = msg.params.exceptionDetails;
      errors.push((d.exception && d.exception.description) || d.text);
    } else if (msg.method === "Runtime.consoleAPICalled" && msg.params.type === "error") {
      errors.push(msg.params.args.map((a) => a.value ?? a.description).join(" "));
    } else if (msg.method === "Log.entryAdded" && msg.params.entry.level === "error") {
      errors.push(`${msg.params.entry.text} (${msg.params.entry.url || ""})`);
    }
  });
  await send("Runtime.enable", {}, sessionId);
  await send("Log.enable", {}, sessionId);
  await send("Page.enable", {}, sessionId);
  const loaded = once("Page.loadEventFired", sessionId);
  await send("Page.navigate", { url }, sessionId);
  await loaded;
  const evaluate = async (expression) => {
    const r = await send("Runtime.evaluate", { expression, returnByValue: true }, sessionId);
    if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.exception.description}`);
    return r.result.value;
  };
  return { sessionId, errors, evaluate };
}

// Waits until `expression` is true in the page, for at most 20 s.
async function until(evaluate, expression) {
  for (let i = 0; i < 400; i++) {
    if (await evaluate(expression)) return;
    await sleep(50);
  }
  throw new Error(`the page never got to: ${expression}`);
}

async function dhat(viewer, file) {
  const { sessionId, errors, evaluate } = await open("file://" + viewer);
  const { root } = await send("DOM.getDocument", {}, sessionId);
  const { nodeId } = await send("DOM.querySelector", { nodeId: root.nodeId, selector: "input[type=file]" }, sessionId);
  // What choosing FILE in the "Load…" button's dialog does: the input's change event.
  await send("DOM.setFileInputFiles", { nodeId, files: [file] }, sessionId);
  await until(evaluate, "/PP 1\\/1 |error/i.test(document.body.innerText) || document.querySelector('.error') !== null");
  const text = await evaluate("document.body.innerText");
  return { text, errors };
}

async function flamegraph(svg, term, tooltip) {
  const { sessionId, errors, evaluate } = await open("file://" + svg);
  // The Search button asks for the term with prompt(): answered as a user types it.
  listeners.push((msg) => {
    if (msg.sessionId === sessionId && msg.method === "Page.javascriptDialogOpening") {
      send("Page.handleJavaScriptDialog", { accept: true, promptText: term }, sessionId);
    }
  });
  const centre = async (expr) => {
    const r = await evaluate(`(() => { const r = ${expr}.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()`);
    return { x: r[0], y: r[1] };
  };
  const click = async ({ x, y }) => {
    for (const type of ["mousePressed", "mouseReleased"]) {
      await send("Input.dispatchMouseEvent", { type, x, y, button: "left", clickCount: 1 }, sessionId);
    }
  };
  await click(await centre("document.getElementById('search')"));
  await until(evaluate, "document.getElementById('matched').textContent.trim() !== ''");
  const matched = await evaluate("document.getElementById('matched').textContent.trim()");
  const frame = `[...document.querySelectorAll('#frames > g')].find(g => g.querySelector('title').textContent.startsWith(${JSON.stringify(tooltip)}))`;
  // Each frame's fill after the search, by its function's name (the tooltip before " (").
  const fills = await evaluate(
    "Object.fromEntries([...document.querySelectorAll('#frames > g')].map(g => " +
      "[g.querySelector('title').textContent.replace(/ \\([^(]*$/, ''), g.querySelector('rect').getAttribute('fill')]))"
  );
  await send("Input.dispatchMouseEvent", { type: "mouseMoved", ...(await centre(`${frame}.querySelector('rect')`)) }, sessionId);
  await until(evaluate, "document.getElementById('details').textContent.trim() !== ''");
  const details = await evaluate("document.getElementById('details').textContent.trim()");
  return { errors, matched, fills, details };
}

(async () => {
  const run = { dhat, flamegraph }[mode];
  if (!run) throw new Error(`unknown mode ${mode}`);
  const out = await run(page, ...rest);
  clearTimeout(timer);
  finish(0, out);
})().catch((e) => {
  clearTimeout(timer);
  console.error(`chromium.js: ${e.message}\nthe browser said:\n${stderr}`);
  finish(1);
});
