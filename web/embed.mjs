// node web/embed.mjs BUNDLE_DIR TEXTS.json: transformers.js's feature-extraction pipeline on an embedding model's web
// bundle, offline, with the dtype its config.json names and the pooling and normalization its edgepress.json names
// (web.options); prints {dtype, options, vectors} as JSON, a vector per text.
import { readFileSync } from "node:fs";
import path from "node:path";
import { env, pipeline } from "@huggingface/transformers";

const [bundle, textsFile] = process.argv.slice(2);
const { options } = JSON.parse(readFileSync(path.join(bundle, "edgepress.json"), "utf8")).web;
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(bundle)) + "/";
const extractor = await pipeline("feature-extraction", path.basename(path.resolve(bundle)), { device: "cpu" });
const texts = JSON.parse(readFileSync(textsFile, "utf8"));
const vectors = [];
for (const text of texts) vectors.push((await extractor(text, options)).tolist()[0]);  // one at a time: as predict.py
console.log(JSON.stringify({ dtype: extractor.model.sessions.model.config.dtype, options, vectors }));
