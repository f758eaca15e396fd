// Drives the playground page (`bertha serve`'s /) in headless Chromium with
// puppeteer-core. Run by scripts/browser-test.sh, which starts the servers:
//
//   node scripts/browser-test.mjs --chromium PATH --mlm-url URL --url URL --out DIR
//
//   --mlm-url  a server whose model has an MLM head: fill-mask is run there
//   --url      a server with the default (headless) model: the attention
//              explorer, and fill-mask must show the server's missing-head error
//
// Prints one PASS / FAIL line per check and exits 1 on any failure.
// Needs puppeteer-core in $BROWSER_TEST_MODULES (a node_modules folder).
import { createRequire } from "node:module";
import path from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
for (const k of ["chromium", "mlm-url", "url", "out"]) {
  if (!args[k]) {
    console.error(`missing --${k}`);
    process.exit(2);
  }
}
const require = createRequire(path.join(process.env.BROWSER_TEST_MODULES || "node_modules", "noop.js"));
const puppeteer = require("puppeteer-core");

let failures = 0;
function check(ok, what, detail = "") {
  console.log(`${ok ? "PASS" : "FAIL"} ${what}${detail ? ` (${detail})` : ""}`);
  if (!ok) failures++;
  return ok;
}

const browser = await puppeteer.launch({
  executablePath: args.chromium,
  headless: true,
  args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--font-render-hinting=none"],
  defaultViewport: { width: 1000, height: 800 },
});

// A page that records page errors, console errors and failed requests; `allow`
// lists the messages a step expects (e.g. the 400 of a missing head).
async function openPage(url) {
  const page = await browser.newPage();
  const problems = [];
  page.allow = [];
  // The browser's own /favicon.ico request (the page has no icon; the server answers 404) is no page error.
  const allowed = (text) => /\/favicon\.ico\b/.test(text) || page.allow.some((re) => re.test(text));
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && !allowed(m.text() + " " + (m.location()?.url || ""))) {
      problems.push(`console error: ${m.text()} ${m.location()?.url || ""}`);
    }
  });
  page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on("response", (r) => {
    if (r.status() >= 400 && !allowed(`${r.status()} ${r.url()}`)) problems.push(`HTTP ${r.status()}: ${r.url()}`);
  });
  page.problems = problems;
  const res = await page.goto(url + "/", { waitUntil: "networkidle0" });
  check(res.ok() && (await page.title()) === "bertha playground", `load ${url}/`, `HTTP ${res.status()}`);
  // The header names the model once /info has answered.
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0, { timeout: 10000 }).catch(() => {});
  const header = await page.$eval("#model", (e) => e.textContent);
  check(header.length > 0, "header shows the model", header);
  return page;
}

function noProblems(page, what) {
  check(page.problems.length === 0, `no page / console errors ${what}`, page.problems.join("; "));
  page.problems.length = 0;
}

// POST from inside the page (same origin), so the test compares the DOM with
// what the server answers.
const api = (page, route, body) =>
  page.evaluate(
    async (route, body) => {
      const r = await fetch(route, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      return { status: r.status, body: await r.json() };
    },
    route,
    body,
  );

async function setValue(page, sel, value) {
  await page.$eval(sel, (e, v) => { e.value = v; }, value);
}

try {
  // ---- fill-mask on the MLM server --------------------------------------------------
  {
    const page = await openPage(args["mlm-url"]);
    const text = "Paris is the [MASK] of France.";
    await page.click("#tab-fill");
    check(await page.$eval("#fill", (e) => e.classList.contains("on") && e.offsetHeight > 0), "fill-mask tab is shown");
    await setValue(page, "#fill-in", text);
    await page.click("#fill button.go");
    await page.waitForSelector("#fill-out table, #fill-out .err", { timeout: 30000 });
    const err = await page.$eval("#fill-out", (e) => e.querySelector(".err")?.textContent || "");
    check(!err, "fill-mask answers without an error", err);
    const rows = await page.$$eval("#fill-out table tr", (trs) =>
      trs.slice(1).map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent)),
    );
    const expected = await api(page, "/fill-mask", { inputs: text, top_k: 5 });
    const want = expected.body[0] || [];
    check(expected.status === 200 && want.length === 5, "POST /fill-mask gives 5 candidates", `HTTP ${expected.status}`);
    check(rows.length === 5, "fill-mask shows 5 result rows", `${rows.length} rows`);
    const wellFormed = rows.every(([tok, score, seq]) => tok && tok.trim() && +score > 0 && +score <= 1 && seq.trim());
    check(wellFormed, "every row has a token, a score in (0, 1] and the filled sequence", JSON.stringify(rows[0]));
    const scores = rows.map((r) => +r[1]);
    check(scores.every((s, i) => i === 0 || s <= scores[i - 1]), "scores are sorted, best first", scores.join(", "));
    const same = rows.length === want.length && rows.every(([tok, score], i) => tok === want[i].token_str && score === want[i].score.toFixed(4));
    check(same, "rows match the server's answer", rows.map((r) => `${r[0]} ${r[1]}`).join(", "));
    noProblems(page, "(fill-mask)");
    const shot = path.join(args.out, "playground-fill-mask.png");
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`saved ${shot}`);
    await page.close();
  }

  // ---- the default model: missing MLM head, then the attention explorer ----------------------
  {
    const page = await openPage(args.url);
    // The embed tab (shown first): the cosine-similarity table of its three default texts.
    await page.click("#embed button.go");
    await page.waitForSelector("#embed-out table, #embed-out .err", { timeout: 30000 });
    const sim = await page.$$eval("#embed-out table tr", (trs) => trs.slice(1).map((tr) => [...tr.querySelectorAll("td")].map((td) => +td.textContent)));
    check(sim.length === 3 && sim.every((r, i) => r.length === 3 && Math.abs(r[i] - 1) < 0.002 && r.every((v, j) => v === sim[j][i])),
      "embed shows a symmetric 3 × 3 similarity table with 1 on the diagonal", JSON.stringify(sim));
    await page.click("#tab-fill");
    page.allow = [/\/fill-mask\b/]; // the expected 400 (and its console line)
    await page.click("#fill button.go");
    await page.waitForSelector("#fill-out table, #fill-out .err", { timeout: 30000 });
    const err = await page.$eval("#fill-out", (e) => e.querySelector(".err")?.textContent || "");
    const info = await page.evaluate(() => fetch("/info").then((r) => r.json()));
    const headless = !(info.architectures || []).some((a) => /MaskedLM|PreTraining/.test(a));
    if (headless) check(/head|mask/i.test(err), "fill-mask on a model without an MLM head shows the server's error", err);
    page.allow = [];

    const sentence = "The bank by the river had a nice view.";
    await page.click("#tab-attention");
    await setValue(page, "#att-in", sentence);
    await page.click("#attention button.go");
    await page.waitForFunction(() => document.getElementById("att-layer").options.length > 0 || document.querySelector("#att-out .err"), { timeout: 30000 });
    const attErr = await page.$eval("#att-out", (e) => e.querySelector(".err")?.textContent || "");
    check(!attErr, "attention answers without an error", attErr);
    const all = await api(page, "/attention", { inputs: sentence });
    const { layers, heads, tokens } = all.body;
    const tok = await api(page, "/tokenize", { inputs: sentence, add_special_tokens: true });
    const n = tok.body[0].length;
    check(tokens.length === n, "POST /attention and POST /tokenize agree on the token count", `${tokens.length} vs ${n}`);
    const opts = await page.evaluate(() => [document.getElementById("att-layer").options.length, document.getElementById("att-head").options.length]);
    check(opts[0] === layers && opts[1] === heads, "layer and head pickers list every layer and head", `${opts[0]} layers, ${opts[1]} heads`);

    // Pick a layer and a head other than 0 the way a user does (select → change event).
    const layer = Math.min(2, layers - 1), head = Math.min(5, heads - 1);
    await page.select("#att-layer", String(layer));
    await page.select("#att-head", String(head));
    const one = await api(page, "/attention", { inputs: sentence, layer, head });
    const m = one.body.attentions[0][0];
    const m00 = all.body.attentions[0][0];
    check(layer > 0 && head > 0 && JSON.stringify(m) !== JSON.stringify(m00), `picked layer ${layer}, head ${head} (not layer 0 / head 0, a different matrix)`);

    // Read the heatmap back from the canvas: the grid is the opaque (v, v, 255)
    // area; it must be n × n square cells whose colours are the picked matrix.
    const grid = await page.evaluate(() => {
      const c = document.getElementById("heat"), g = c.getContext("2d");
      const { data, width, height } = g.getImageData(0, 0, c.width, c.height);
      const px = (x, y) => { const k = 4 * (y * width + x); return [data[k], data[k + 1], data[k + 2], data[k + 3]]; };
      const cellish = ([r, gr, b, a]) => a === 255 && b === 255 && r === gr;
      let x0 = width, y0 = height, x1 = -1, y1 = -1;
      for (let y = 0; y < height; y++) for (let x = 0; x < width; x++) {
        if (cellish(px(x, y))) { x0 = Math.min(x0, x); y0 = Math.min(y0, y); x1 = Math.max(x1, x); y1 = Math.max(y1, y); }
      }
      return { x0, y0, x1, y1 };
    });
    const w = grid.x1 - grid.x0 + 1, h = grid.y1 - grid.y0 + 1;
    const cell = w / n;
    check(grid.x1 >= 0 && w === h && Number.isInteger(cell) && cell >= 4,
      `heatmap is a square grid of ${n} × ${n} cells`, `${w}×${h} px at (${grid.x0}, ${grid.y0}), cell ${cell} px`);
    const cells = await page.evaluate((x0, y0, cell, n) => {
      const c = document.getElementById("heat"), g = c.getContext("2d");
      const { data, width, height } = g.getImageData(0, 0, c.width, c.height);
      const px = (x, y) => { const k = 4 * (y * width + x); return [data[k], data[k + 1], data[k + 2], data[k + 3]]; };
      const ink = (xa, xb, ya, yb) => {
        let k = 0;
        for (let y = Math.max(0, ya); y < Math.min(height, yb); y++) for (let x = Math.max(0, xa); x < Math.min(width, xb); x++) {
          const [r, , b, a] = px(x, y);
          if (a > 80 && r < 160 && b < 160) k++;
        }
        return k;
      };
      const centre = [];
      for (let i = 0; i < n; i++) { centre.push([]); for (let j = 0; j < n; j++) centre[i].push(px(x0 + j * cell + (cell >> 1), y0 + i * cell + (cell >> 1))); }
      // token labels: left of each row, above each column (one more row/column must be blank)
      const rowInk = [...Array(n + 1).keys()].map((i) => ink(0, x0, y0 + i * cell, y0 + (i + 1) * cell));
      const colInk = [...Array(n + 1).keys()].map((j) => ink(x0 + j * cell, x0 + (j + 1) * cell, 0, y0));
      const past = [px(Math.min(width - 1, x0 + n * cell + 1), y0 + (cell >> 1)), px(x0 + (cell >> 1), Math.min(height - 1, y0 + n * cell + 1))];
      return { centre, rowInk, colInk, past };
    }, grid.x0, grid.y0, cell, n);
    let worst = 0;
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
      const shade = Math.round(255 * (1 - m[i][j]));
      const [r, g, b] = cells.centre[i][j];
      worst = Math.max(worst, Math.abs(r - shade), Math.abs(g - shade), Math.abs(b - 255));
    }
    check(worst <= 2, `every heatmap cell has the colour of layer ${layer} / head ${head}'s attention`, `largest difference ${worst}/255`);
    check(cells.past.every((p) => p[3] === 0), "nothing is drawn past the last row and column");
    const rowsWithLabel = cells.rowInk.slice(0, n).filter((k) => k > 0).length;
    const colsWithLabel = cells.colInk.slice(0, n).filter((k) => k > 0).length;
    check(rowsWithLabel === n && colsWithLabel === n && cells.rowInk[n] === 0 && cells.colInk[n] === 0,
      `one token label per row and per column (${n} tokens)`, `rows ${rowsWithLabel}, columns ${colsWithLabel}`);
    const caption = await page.$eval("#att-out", (e) => e.textContent);
    const max = Math.max(...m.flat()).toFixed(3);
    check(caption.includes(`max ${max}`), "caption names the picked head's largest weight", caption);
    noProblems(page, "(missing head, attention)");
    const shot = path.join(args.out, "playground-attention.png");
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`saved ${shot}`);
    await page.close();
  }
} catch (e) {
  check(false, "browser test ran to the end", e.stack || String(e));
} finally {
  await browser.close();
}
console.log(failures ? `FAIL ${failures} check(s) failed` : "PASS all browser checks");
process.exit(failures ? 1 : 0);
