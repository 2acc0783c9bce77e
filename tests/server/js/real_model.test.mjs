// The official `openai` SDK against `flashseek serve` on the random `demo` checkpoint (real
// tokenizer, chat encoder, output parser and CPU engine). Replies are random text, so the tests
// check structure and consistency, not words. Started by tests/server/engine_serve_test.cpp.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const url = process.env.FLASHSEEK_URL;
if (!url) throw new Error('set FLASHSEEK_URL to a running flashseek server');
const model = 'deepseek-v4.1-flash';
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
const user = (content) => [{ role: 'user', content }];

async function collect(stream) {
  const out = { content: '', reasoning: '', finish: null, usage: null };
  for await (const chunk of stream) {
    if (chunk.usage) out.usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.finish_reason) out.finish = c.finish_reason;
    out.content += c.delta.content ?? '';
    out.reasoning += c.delta.reasoning_content ?? '';
  }
  return out;
}

test('streamed chat equals non-streamed chat for the same seed', async () => {
  const params = { model, messages: user('Write a haiku.'), max_tokens: 12, temperature: 0.8,
                   seed: 7, thinking: { type: 'disabled' } };
  const once = await client.chat.completions.create(params);
  const streamed = await collect(await client.chat.completions.create({
    ...params, stream: true, stream_options: { include_usage: true } }));
  assert.equal(streamed.content, once.choices[0].message.content);
  assert.equal(streamed.finish, once.choices[0].finish_reason);
  assert.deepEqual(streamed.usage.completion_tokens, once.usage.completion_tokens);
  assert.ok(once.usage.prompt_tokens > 3);
});

test('thinking mode reports reasoning_content', async () => {
  const r = await client.chat.completions.create({
    model, messages: user('Think.'), max_tokens: 6, thinking: { type: 'enabled' } });
  assert.equal(typeof r.choices[0].message.reasoning_content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
});

test('tools are rendered into the prompt (too long for the demo context)', async () => {
  // The demo config has a 64-token context; the rendered tools block alone is longer, so the
  // request must fail with context_length_exceeded, naming a prompt far longer than without tools.
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: {
    type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const plain = await client.chat.completions.create({ model, messages: user('Weather?'),
                                                       max_tokens: 2 });
  await assert.rejects(
    client.chat.completions.create({ model, messages: user('Weather?'), tools, max_tokens: 2 }),
    (e) => {
      const n = Number(/the prompt has (\d+) tokens/.exec(e.message)?.[1]);
      return e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' &&
             n > plain.usage.prompt_tokens + 50;
    });
});

test('chat logprobs are sorted log-probabilities', async () => {
  const r = await client.chat.completions.create({ model, messages: user('Hi'), max_tokens: 4,
                                                   temperature: 0, logprobs: true,
                                                   top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 4);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    for (let i = 1; i < 3; ++i) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
    // Greedy (temperature 0) picks the most likely token: it is the first of top_logprobs.
    assert.equal(t.token, t.top_logprobs[0].token);
    assert.equal(t.logprob, t.top_logprobs[0].logprob);
  }
});

test('completions: echo and logprobs cover prompt and generated tokens', async () => {
  const r = await client.completions.create({ model, prompt: 'Hello world', max_tokens: 3,
                                              echo: true, logprobs: 2, temperature: 0 });
  const c = r.choices[0];
  assert.ok(c.text.startsWith('Hello world'));
  assert.equal(c.logprobs.tokens.length, r.usage.prompt_tokens + 3);
  assert.equal(c.logprobs.token_logprobs[0], null);
  assert.ok(c.logprobs.token_logprobs.slice(1).every((x) => x <= 0));
});

test('errors come back as typed SDK errors', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'nope', messages: user('x') }),
                       (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(client.chat.completions.create({ model, messages: user('x'), n: 3 }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
  await assert.rejects(client.completions.create({ model, prompt: 'x', max_tokens: 100000000 }),
                       (e) => e instanceof OpenAI.BadRequestError &&
                              e.code === 'context_length_exceeded');
});
