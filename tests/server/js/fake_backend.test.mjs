// The official `openai` SDK against a live flashseek server (FLASHSEEK_URL). Started by
// tests/server/js_test.cpp with the deterministic fake backend (tests/server/fakes.h), whose
// replies are scripted by keywords in the prompt (CALLTOOL, THINK). real_model.test.mjs drives
// the real engine instead.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const url = process.env.FLASHSEEK_URL;
if (!url) throw new Error('set FLASHSEEK_URL to a running flashseek server');
const model = process.env.FLASHSEEK_MODEL ?? 'deepseek-v4.1-flash';
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
const user = (content) => [{ role: 'user', content }];

async function streamChat(params) {
  const stream = await client.chat.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  });
  const out = { content: '', reasoning: '', finish: null, usage: null, calls: [] };
  for await (const chunk of stream) {
    if (chunk.usage) out.usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.finish_reason) out.finish = choice.finish_reason;
    const d = choice.delta;
    if (d.content) out.content += d.content;
    if (d.reasoning_content) out.reasoning += d.reasoning_content;
    for (const tc of d.tool_calls ?? []) {
      out.calls[tc.index] ??= { id: '', name: '', arguments: '' };
      if (tc.id) out.calls[tc.index].id = tc.id;
      if (tc.function?.name) out.calls[tc.index].name = tc.function.name;
      out.calls[tc.index].arguments += tc.function?.arguments ?? '';
    }
  }
  return out;
}

test('models list has the served ids', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes('deepseek-v4.1-flash'));
});

test('chat, non-streamed', async () => {
  const r = await client.chat.completions.create({ model, messages: user('hello'), temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.choices[0].message.content, /^Reply:/);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.usage.completion_tokens > 0);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('streamed text equals non-streamed text for the same seed', async () => {
  const params = { model, messages: user('same seed'), temperature: 0.9, seed: 1234,
                   thinking: { type: 'disabled' } };
  const once = await client.chat.completions.create(params);
  const streamed = await streamChat(params);
  assert.equal(streamed.content, once.choices[0].message.content);
  assert.equal(streamed.finish, once.choices[0].finish_reason);
  assert.equal(streamed.usage.completion_tokens, once.usage.completion_tokens);
});

test('thinking mode splits reasoning_content from content', async () => {
  const params = { model, messages: user('THINK'), thinking: { type: 'enabled' } };
  const once = await client.chat.completions.create(params);
  assert.equal(once.choices[0].message.reasoning_content, 'Two plus two.');
  assert.equal(once.choices[0].message.content, 'The answer is 4.');
  const streamed = await streamChat(params);
  assert.equal(streamed.reasoning, 'Two plus two.');
  assert.equal(streamed.content, 'The answer is 4.');
});

test('tool calls, streamed and not', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const params = { model, messages: user('CALLTOOL weather in Paris?'), tools };
  const once = await client.chat.completions.create(params);
  const call = once.choices[0].message.tool_calls[0];
  assert.equal(once.choices[0].finish_reason, 'tool_calls');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  const streamed = await streamChat(params);
  assert.equal(streamed.finish, 'tool_calls');
  assert.equal(streamed.calls.length, 1);
  assert.equal(streamed.calls[0].name, 'get_weather');
  assert.equal(streamed.calls[0].arguments, call.function.arguments);
});

test('chat logprobs', async () => {
  const r = await client.chat.completions.create({
    model, messages: user('hello'), max_tokens: 3, logprobs: true, top_logprobs: 2 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 3);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
  }
  assert.equal(lp.map((t) => t.token).join(''), r.choices[0].message.content);
});

test('completions: text, echo, logprobs, token-id prompt', async () => {
  const r = await client.completions.create({ model, prompt: 'abc', max_tokens: 4, echo: true,
                                              logprobs: 1, temperature: 0 });
  assert.equal(r.choices[0].text, 'abcRepl');
  assert.equal(r.choices[0].logprobs.tokens.length, 7);
  assert.equal(r.choices[0].logprobs.token_logprobs[0], null);
  const ids = await client.completions.create({ model, prompt: [120, 121], max_tokens: 2 });
  assert.equal(ids.choices[0].text, 'Re');
  const stream = await client.completions.create({ model, prompt: 'abc', max_tokens: 4,
                                                   stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, 'Repl');
});

test('errors come back as typed SDK errors', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: user('x') }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(
    client.chat.completions.create({ model, messages: user('x'), n: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
  await assert.rejects(
    client.chat.completions.create({ model, messages: user('x'), temperature: 7 }),
    (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
  await assert.rejects(
    client.completions.create({ model, prompt: 'x', max_tokens: 1e6 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
});
