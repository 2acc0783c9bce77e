// Reference token ids from @huggingface/tokenizers (pure JS port of HF tokenizers) for the
// parity test. Loads the SAME tokenizer.json with its added_tokens replaced by the V4.1 table,
// all matched verbatim (normalized=false), as flashseek does.
// Usage: node scripts/tokenizer_parity_ref.mjs TOKENIZER_JSON ADDED_TOKENS_JSON CORPUS_JSONL OUT_JSONL
// Output: one JSON array of ids per corpus line.
import fs from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizerPath, addedPath, corpusPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: tokenizer_parity_ref.mjs TOKENIZER_JSON ADDED_TOKENS_JSON CORPUS OUT");
  process.exit(2);
}
const tokJson = JSON.parse(fs.readFileSync(tokenizerPath, "utf8"));
const added = JSON.parse(fs.readFileSync(addedPath, "utf8")).added_tokens;
tokJson.added_tokens = added.map((t) => ({
  id: t.id, content: t.content, single_word: false, lstrip: false, rstrip: false,
  normalized: false, special: true,
}));
// No BOS/EOS from the config: flashseek never adds them implicitly.
const tokenizer = new Tokenizer(tokJson, { add_bos_token: false, add_eos_token: false });
const lines = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length > 0);
const out = [];
const t0 = Date.now();
let bytes = 0;
for (const line of lines) {
  const text = JSON.parse(line);
  bytes += Buffer.byteLength(text, "utf8");
  out.push(JSON.stringify(tokenizer.encode(text, { add_special_tokens: false }).ids));
}
fs.writeFileSync(outPath, out.join("\n") + "\n");
const secs = (Date.now() - t0) / 1000;
console.error(`tokenizer_parity_ref: ${lines.length} docs, ${bytes} bytes in ${secs.toFixed(2)} s`);
