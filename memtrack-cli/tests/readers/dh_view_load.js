// Loads a DHAT JSON file the way Valgrind's own viewer does: runs dh_view.js (shipped with
// valgrind) in a VM context with a minimal DOM, parses the file into its `gData` and builds its
// tree (`buildTree`, which checks the fields and the version and throws on what it cannot
// read); prints the root's totals as JSON. Usage: node dh_view_load.js DH_VIEW_JS FILE
"use strict";
const fs = require("fs");
const vm = require("vm");
const [viewer, data] = process.argv.slice(2);
function element() {
  return {
    childNodes: [],
    style: {},
    classList: { add() {}, remove() {} },
    appendChild(c) { this.childNodes.push(c); return c; },
    setAttribute() {},
    addEventListener() {},
  };
}
const ctx = {
  console,
  URLSearchParams,
  document: {
    title: "",
    body: element(),
    createElement: element,
    createTextNode: element,
    location: { search: "" },
  },
};
ctx.window = ctx;
vm.createContext(ctx);
vm.runInContext(fs.readFileSync(viewer, "utf8"), ctx, { filename: viewer });
ctx.__text = fs.readFileSync(data, "utf8");
vm.runInContext(
  "gSelect = { childNodes: gSelectData.map(() => ({})), selectedIndex: 0 };" +
    "gData = JSON.parse(__text); buildTree();",
  ctx
);
console.log(
  vm.runInContext(
    "JSON.stringify({ tb: gRoot._totalBytes, tbk: gRoot._totalBlocks, tl: gRoot._totalLifetimes," +
      " gb: gRoot._atTGmaxBytes, gbk: gRoot._atTGmaxBlocks, eb: gRoot._atTEndBytes," +
      " ebk: gRoot._atTEndBlocks })",
    ctx
  )
);
