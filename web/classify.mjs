// node web/classify.mjs BUNDLE_DIR TEXTS.json: transformers.js's text-classification pipeline on a web bundle,
// offline, with the dtype its config.json names, through the bundle's own cascade.mjs (as its page answers: a
// cascade's texts by the student or its fallback); prints {dtype, predictions: [{label, score, model, confidence}]}
// as JSON, one per text.
import { openBundle } from "./bundle.mjs";

const { models, texts } = await openBundle(process.argv.slice(2));
const out = [];
for (const text of texts) {  // one at a time: as predict.py's batches of one
  const { model, confidence, result } = await models.answer(text, {});
  out.push({ ...result[0], model, confidence });
}
console.log(JSON.stringify({ dtype: models.student.model.sessions.model.config.dtype, predictions: out }));
