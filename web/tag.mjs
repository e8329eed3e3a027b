// node web/tag.mjs BUNDLE_DIR TEXTS.json: transformers.js's token-classification pipeline on a token classifier's web
// bundle, offline, with the dtype its config.json names, through the bundle's own cascade.mjs (as its page answers);
// prints {dtype, tokens, entities, models, confidences} as JSON: per text, each token's tag but O
// (aggregation_strategy "none": {entity, score, index, word}), the entities the page shows (its edgepress.json's
// web.options: "simple", tags of one type joined), which model answered (student, or a cascade's fallback) and the
// student's confidence (null without a cascade).
import { openBundle } from "./bundle.mjs";

const { manifest, models, texts } = await openBundle(process.argv.slice(2));
const tokens = [];
const entities = [];
const answered = [];
const confidences = [];
for (const text of texts) {  // one at a time: as predict.py
  tokens.push((await models.answer(text, { aggregation_strategy: "none" })).result);
  const found = await models.answer(text, manifest.web.options);
  entities.push(found.result);
  answered.push(found.model);
  confidences.push(found.confidence);
}
console.log(JSON.stringify({ dtype: models.student.model.sessions.model.config.dtype, tokens, entities,
  models: answered, confidences }));
