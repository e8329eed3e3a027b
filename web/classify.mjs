// node web/classify.mjs BUNDLE_DIR TEXTS.json: transformers.js's text-classification pipeline on a web bundle,
// offline, with the dtype its config.json names, through the bundle's own cascade.mjs (as its page answers: a
// cascade's texts by the student or its fallback); prints {dtype, predictions: [{label, score, model, confidence}]}
// as JSON, one per text.
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { env, pipeline } from "@huggingface/transformers";

const [bundle, textsFile] = process.argv.slice(2);
const { openModels } = await import(pathToFileURL(path.join(path.resolve(bundle), "cascade.mjs")).href);
const manifest = JSON.parse(readFileSync(path.join(bundle, "edgepress.json"), "utf8"));
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(bundle)) + "/";
const models = await openModels(pipeline, manifest, path.basename(path.resolve(bundle)), { device: "cpu" });
const texts = JSON.parse(readFileSync(textsFile, "utf8"));
const out = [];
for (const text of texts) {  // one at a time: as predict.py's batches of one
  const { model, confidence, result } = await models.answer(text, {});
  out.push({ ...result[0], model, confidence });
}
console.log(JSON.stringify({ dtype: models.student.model.sessions.model.config.dtype, predictions: out }));
