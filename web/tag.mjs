// node web/tag.mjs BUNDLE_DIR TEXTS.json: transformers.js's token-classification pipeline on a token classifier's web
// bundle, offline, with the dtype its config.json names; prints {dtype, tokens, entities} as JSON: per text, each
// token's tag but O (aggregation_strategy "none": {entity, score, index, word}) and the entities the page shows
// (its edgepress.json's web.options: "simple", tags of one type joined).
import { readFileSync } from "node:fs";
import path from "node:path";
import { env, pipeline } from "@huggingface/transformers";

const [bundle, textsFile] = process.argv.slice(2);
const { options } = JSON.parse(readFileSync(path.join(bundle, "edgepress.json"), "utf8")).web;
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(bundle)) + "/";
const tagger = await pipeline("token-classification", path.basename(path.resolve(bundle)), { device: "cpu" });
const texts = JSON.parse(readFileSync(textsFile, "utf8"));
const tokens = [];
const entities = [];
for (const text of texts) {  // one at a time: as predict.py
  tokens.push(await tagger(text, { aggregation_strategy: "none" }));
  entities.push(await tagger(text, options));
}
console.log(JSON.stringify({ dtype: tagger.model.sessions.model.config.dtype, tokens, entities }));
