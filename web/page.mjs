// node web/page.mjs URL TEXT SCREENSHOT.png: open the bundle's page in headless Chromium (Debian's `chromium`, or
// $CHROMIUM), wait for the model, type TEXT, press the button (Classify, or Rank for an embedding model's page), save
// a screenshot; prints {result, shown, model, requests}: what the page left in body's data-result (a label, or the
// ranked lines as JSON) and showed, and which model answered (a cascade's student or fallback).
import puppeteer from "puppeteer-core";

const [url, text, screenshot] = process.argv.slice(2);
const browser = await puppeteer.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true, args: ["--no-sandbox", "--disable-gpu"] });
try {
  const page = await browser.newPage();
  const requests = [];
  page.on("request", (r) => requests.push(r.url()));
  page.on("pageerror", (e) => console.error("page error:", e.message));
  await page.setViewport({ width: 900, height: 600 });
  await page.goto(url);
  await page.waitForSelector("body[data-ready]", { timeout: 120000 });
  await page.type("#text", text);
  await page.click("#go");
  await page.waitForSelector("body[data-result]", { timeout: 60000 });
  const result = await page.$eval("body", (b) => b.dataset.result);
  const shown = await page.$eval("#result", (e) => e.textContent);
  const model = await page.$eval("body", (b) => b.dataset.model);
  await page.screenshot({ path: screenshot });
  console.log(JSON.stringify({ result, shown, model, requests }));
} finally {
  await browser.close();
}
