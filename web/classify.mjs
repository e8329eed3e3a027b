// node web/classify.mjs BUNDLE_DIR TEXTS.json: transformers.js's text-classification pipeline on a web bundle,
// offline, with the dtype its config.json names; prints [{label, score}] per text as JSON.
import { readFileSync } from "node:fs";
import path from "node:path";
import { env, pipeline } from "@huggingface/transformers";

const [bundle, textsFile] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(bundle)) + "/";
const classifier = await pipeline("text-classification", path.basename(path.resolve(bundle)), { device: "cpu" });
const texts = JSON.parse(readFileSync(textsFile, "utf8"));
const out = [];
for (const text of texts) out.push((await classifier(text))[0]);  // one at a time: as predict.py's batches of one
console.log(JSON.stringify({ dtype: classifier.model.sessions.model.config.dtype, predictions: out }));
