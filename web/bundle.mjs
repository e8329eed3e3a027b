// What web/*.mjs share: a web bundle opened under Node, offline, through the bundle's own cascade.mjs (as its page
// opens it): {manifest, models, texts} for `node web/SCRIPT.mjs BUNDLE_DIR TEXTS.json`.
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { env, pipeline } from "@huggingface/transformers";

export async function openBundle([bundle, textsFile]) {
  const root = path.resolve(bundle);
  const { openModels } = await import(pathToFileURL(path.join(root, "cascade.mjs")).href);
  const manifest = JSON.parse(readFileSync(path.join(root, "edgepress.json"), "utf8"));
  env.allowRemoteModels = false;
  env.localModelPath = path.dirname(root) + "/";
  const models = await openModels(pipeline, manifest, path.basename(root), { device: "cpu" });
  return { manifest, models, texts: JSON.parse(readFileSync(textsFile, "utf8")) };
}
