// node web/embed.mjs BUNDLE_DIR TEXTS.json: transformers.js's feature-extraction pipeline on an embedding model's web
// bundle, offline, with the dtype its config.json names and the pooling and normalization its edgepress.json names
// (web.options); prints {dtype, options, vectors} as JSON, a vector per text.
import { openBundle } from "./bundle.mjs";

const { manifest, models, texts } = await openBundle(process.argv.slice(2));
const { options } = manifest.web;
const vectors = [];
for (const text of texts) vectors.push((await models.student(text, options)).tolist()[0]);  // one at a time: as predict.py
console.log(JSON.stringify({ dtype: models.student.model.sessions.model.config.dtype, options, vectors }));
