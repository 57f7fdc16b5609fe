// The official OpenAI Node SDK (npm `openai`, v4) against a running specd.
// Run by tests/openai_node_test.py, which starts the daemon and computes the expected
// outputs with the offline engine (`specd generate --json`); they arrive in the JSON file
// named by $SPECD_NODE_EXPECT. Uses node's built-in test runner (node --test).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import OpenAI from "openai";

const E = JSON.parse(readFileSync(process.env.SPECD_NODE_EXPECT, "utf8"));
const client = new OpenAI({ baseURL: E.base_url, apiKey: "unused", maxRetries: 0,
                            timeout: 120_000 });
const TOL = 1e-3;  // logprobs: the same fp32 engine, possibly in a different batch

function near(actual, expected, what) {
  assert.ok(Math.abs(actual - expected) <= TOL, `${what}: ${actual} vs ${expected}`);
}

test("models.list names the served model", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [E.model]);
});

test("completions: greedy text equals the offline engine", async () => {
  const r = await client.completions.create({
    model: E.model, prompt: E.prompt, max_tokens: E.greedy_tokens, temperature: 0,
    ignore_eos: true,
  });
  assert.equal(r.object, "text_completion");
  assert.equal(r.model, E.model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].text, E.greedy_text);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.prompt_tokens, E.prompt_tokens);
  assert.equal(r.usage.completion_tokens, E.greedy_tokens);
  assert.equal(r.usage.total_tokens, E.prompt_tokens + E.greedy_tokens);
});

test("completions: streaming with include_usage", async () => {
  const stream = await client.completions.create({
    model: E.model, prompt: E.prompt, max_tokens: E.greedy_tokens, temperature: 0,
    ignore_eos: true, stream: true, stream_options: { include_usage: true },
  });
  let text = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) {
      assert.equal(usage, null, "one usage chunk");
      assert.deepEqual(chunk.choices, [], "the usage chunk has no choices");
      usage = chunk.usage;
      continue;
    }
    assert.equal(chunk.usage ?? null, null, "content chunks carry usage: null");
    for (const c of chunk.choices) {
      assert.equal(c.index, 0);
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks > 2, `streamed in ${chunks} chunks`);
  assert.equal(text, E.greedy_text);
  assert.equal(finish, "length");
  assert.deepEqual(
    [usage.prompt_tokens, usage.completion_tokens, usage.total_tokens],
    [E.prompt_tokens, E.greedy_tokens, E.prompt_tokens + E.greedy_tokens]);
});

test("completions: n seeded samples, choice j uses seed + j", async () => {
  const r = await client.completions.create({
    model: E.model, prompt: E.prompt, max_tokens: 16, temperature: 0.8, seed: 11, n: 3,
    ignore_eos: true,
  });
  assert.equal(r.choices.length, 3);
  const byIndex = [...r.choices].sort((a, b) => a.index - b.index);
  assert.deepEqual(byIndex.map((c) => c.index), [0, 1, 2]);
  assert.deepEqual(byIndex.map((c) => c.text), E.samples);
  assert.equal(r.usage.completion_tokens, 48);
});

test("completions: streaming n=3 interleaves choices by index", async () => {
  const stream = await client.completions.create({
    model: E.model, prompt: E.prompt, max_tokens: 16, temperature: 0.8, seed: 11, n: 3,
    ignore_eos: true, stream: true,
  });
  const texts = ["", "", ""];
  const finished = [false, false, false];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      texts[c.index] += c.text;
      if (c.finish_reason) finished[c.index] = true;
    }
  }
  assert.deepEqual(texts, E.samples);
  assert.deepEqual(finished, [true, true, true]);
});

test("completions: stop string ends the text and is not included", async () => {
  const r = await client.completions.create({
    model: E.model, prompt: E.stop_prompt, max_tokens: 40, temperature: 0, stop: ["\n\n"],
  });
  assert.equal(r.choices[0].text, E.stop_text);
  assert.ok(!r.choices[0].text.includes("\n\n"));
  assert.equal(r.choices[0].finish_reason, "stop");
  // Streaming gives the same text (held-back prefixes of the stop string are cut too).
  const stream = await client.completions.create({
    model: E.model, prompt: E.stop_prompt, max_tokens: 40, temperature: 0, stop: "\n\n",
    stream: true,
  });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
  assert.equal(text, E.stop_text);
});

test("completions: logprobs match the engine's", async () => {
  const r = await client.completions.create({
    model: E.model, prompt: E.prompt, max_tokens: E.logprobs.length, temperature: 0,
    ignore_eos: true, logprobs: 3,
  });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, E.logprobs.length);
  assert.equal(lp.token_logprobs.length, E.logprobs.length);
  assert.equal(lp.top_logprobs.length, E.logprobs.length);
  assert.equal(lp.tokens.join(""), r.choices[0].text);
  assert.equal(lp.text_offset[0], 0);
  E.logprobs.forEach((want, i) => {
    near(lp.token_logprobs[i], want.logprob, `token ${i}`);
    const top = Object.values(lp.top_logprobs[i]).sort((a, b) => a - b);
    assert.ok(top.length >= 1 && top.length <= 3, `top_logprobs[${i}] has ${top.length}`);
    // Each reported alternative is one of the engine's top 3 (equal strings may merge).
    for (const v of top) assert.ok(want.top.some((w) => Math.abs(w - v) <= TOL), `top ${v}`);
    assert.ok(lp.token_logprobs[i] <= 0);
  });
});

test("chat: greedy reply equals the engine on the templated prompt", async () => {
  const r = await client.chat.completions.create({
    model: E.model, messages: [{ role: "user", content: E.chat_user }],
    max_tokens: E.chat_tokens, temperature: 0, ignore_eos: true,
  });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(r.choices[0].message.content, E.chat_text);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.prompt_tokens, E.chat_prompt_tokens);
  assert.equal(r.usage.completion_tokens, E.chat_tokens);
});

test("chat: streaming deltas with include_usage", async () => {
  const stream = await client.chat.completions.create({
    model: E.model, messages: [{ role: "user", content: E.chat_user }],
    max_completion_tokens: E.chat_tokens, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let role = null;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) {
      usage = chunk.usage;
      assert.deepEqual(chunk.choices, []);
      continue;
    }
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(text, E.chat_text);
  assert.equal(finish, "length");
  assert.equal(usage.prompt_tokens, E.chat_prompt_tokens);
  assert.equal(usage.completion_tokens, E.chat_tokens);
});

test("chat: logprobs and top_logprobs", async () => {
  const r = await client.chat.completions.create({
    model: E.model, messages: [{ role: "user", content: E.chat_user }],
    max_tokens: E.chat_logprobs.length, temperature: 0, ignore_eos: true, logprobs: true,
    top_logprobs: 2,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, E.chat_logprobs.length);
  assert.equal(content.map((t) => t.token).join(""), r.choices[0].message.content);
  content.forEach((t, i) => {
    near(t.logprob, E.chat_logprobs[i], `chat token ${i}`);
    assert.equal(t.top_logprobs.length, 2);
    const top = t.top_logprobs.map((x) => x.logprob).sort((a, b) => a - b);
    top.forEach((v, k) => near(v, E.chat_top_logprobs[i][k], `chat top ${i}.${k}`));
    assert.ok(Array.isArray(t.bytes));
  });
});

test("errors surface as the SDK's typed errors", async () => {
  await assert.rejects(
    client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 1 }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(
    client.chat.completions.create({ model: E.model, messages: [], max_tokens: 1 }),
    (e) => e instanceof OpenAI.APIError && e.status >= 400 && e.status < 500 &&
           typeof e.message === "string" && e.message.length > 0);
  await assert.rejects(
    client.completions.create({ model: E.model, prompt: "x", max_tokens: 1_000_000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
  // The server keeps serving.
  const r = await client.completions.create({ model: E.model, prompt: "x", max_tokens: 2 });
  assert.equal(r.choices.length, 1);
});
