// What a web bundle answers with, as its predict.py answers (edgepress/device/cascade.py): the bundle's model alone,
// or its cascade: the student answers each text it is sure of and hands the others to the fallback (its own folder,
// tokenizer and dtype: edgepress.json's cascade and web.fallback). One decision a text: the student's confidence is
// its top softmax probability (rule "top") or the top two's difference ("margin"), a token classifier's the least
// confident of its real tokens ([CLS] and [SEP] left out); a text under the threshold goes to the fallback.
// The page (index.html) and web/*.mjs under Node import it, each handing in its own transformers.js `pipeline`.

function softmax(row) {
  const top = Math.max(...row);
  const exp = row.map((v) => Math.exp(v - top));
  const sum = exp.reduce((a, b) => a + b, 0);
  return exp.map((v) => v / sum);
}

function rows(tensor) {  // a [1, labels] or [1, seq, labels] Tensor as its rows of numbers
  const width = tensor.dims.at(-1);
  const values = Array.from(tensor.data, Number);
  const found = [];
  for (let i = 0; i < values.length; i += width) found.push(values.slice(i, i + width));
  return found;
}

// How sure a model is of one text, from its logits (batch 1) and the attention mask it read
export function confidence(logits, attentionMask, rule) {
  let kept = rows(logits);
  if (logits.dims.length === 3) {  // a token classifier: its real tokens but the first and last
    const real = Array.from(attentionMask.data, Number).flatMap((m, j) => (m ? [j] : []));
    kept = (real.length > 2 ? real.slice(1, -1) : real).map((j) => kept[j]);
  }
  return Math.min(...kept.map((row) => {
    const p = softmax(row).sort((a, b) => b - a);
    return p[0] - (rule === "margin" && p.length > 1 ? p[1] : 0);
  }));
}

// One text's feeds, truncated as predict.py truncates (transformers' tokenizers): the first tokens and the last, its
// [SEP]. (transformers.js 4.3 truncates after it adds the special tokens, and so cuts the [SEP] off a long text.)
function encode(run, text) {
  const inputs = run.tokenizer([text], { padding: false, truncation: false });
  const n = inputs.input_ids.dims[1];
  const limit = run.tokenizer.model_max_length;
  if (!(n > limit)) return inputs;
  const keep = [...Array(limit - 1).keys(), n - 1];
  return Object.fromEntries(Object.entries(inputs).map(([name, t]) => [name,
    new t.constructor(t.type, t.data.constructor.from(keep, (j) => t.data[j]), [1, limit])]));
}

async function logitsOf(run, text) {
  const inputs = encode(run, text);
  return { inputs, logits: (await run.model(inputs)).logits };
}

function labelled(run, logits) {  // text-classification's answer with top_k: null: every label, most probable first
  const id2label = run.model.config.id2label;
  return softmax(rows(logits)[0]).map((score, i) => ({ label: id2label?.[i] ?? `LABEL_${i}`, score }))
    .sort((a, b) => b.score - a.score);
}

// The bundle's models, loaded: {student, fallback (null without a cascade), answer(text, options)}; answer gives
// {model: "student" | "fallback", confidence (the student's; null without a cascade), result (the pipeline's; a
// classifier's from the logits of a text encoded as predict.py encodes it, `encode`)}.
// `model`: the bundle's model id under env.localModelPath; `extra`: more pipeline options (Node: {device: "cpu"}).
export async function openModels(pipeline, manifest, model, extra = {}) {
  const web = manifest.web;
  const spec = manifest.cascade;
  const student = await pipeline(web.pipeline, model, { dtype: web.dtype, ...extra });
  const fallback = spec ? await pipeline(web.pipeline, `${model}/${spec.fallback}`,
    { dtype: web.fallback.dtype, ...extra }) : null;
  const classifier = web.pipeline === "text-classification";
  async function answer(text, options) {
    if (!fallback && !classifier) return { model: "student", confidence: null, result: await student(text, options) };
    const { inputs, logits } = await logitsOf(student, text);
    const sure = fallback ? confidence(logits, inputs.attention_mask, spec.rule) : null;
    const run = fallback && sure < spec.threshold ? fallback : student;
    const route = run === fallback ? "fallback" : "student";
    if (classifier) {  // the answer from the logits the answering model gave
      const scores = labelled(run, run === fallback ? (await logitsOf(fallback, text)).logits : logits);
      return { model: route, confidence: sure, result: options?.top_k === null ? scores : scores.slice(0, 1) };
    }
    // a tagger's entities: its pipeline joins the tokens (truncating as transformers.js does), so a text the
    // student keeps runs through it again
    return { model: route, confidence: sure, result: await run(text, options) };
  }
  return { student, fallback, answer };
}
