/**
 * The TypeScript client against a live daemon (started by tests/desktop/test_node_client.py with the
 * tiny model): ZENEDGE_HOME is its home, ZENEDGE_TOKEN its TCP token.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { DaemonUnavailable, FetchTransport, ZenedgeClient, ZenedgeError } from "../src/index.js";
import { NodeTransport, discover, ensureDaemon, readDaemonInfo, type DaemonInfo } from "../src/node.js";
import type { ChatCompletionRequest, Ps } from "../src/wire.js";

const home = process.env.ZENEDGE_HOME;
const token = process.env.ZENEDGE_TOKEN;
assert.ok(home && token, "run through tests/desktop/test_node_client.py (ZENEDGE_HOME and ZENEDGE_TOKEN)");
const info = readDaemonInfo(home) as DaemonInfo;
assert.ok(info, `no daemon.json in ${home}`);
const [host, port] = [info.tcp!.split(":")[0], Number(info.tcp!.split(":")[1])];

const transports: Record<string, () => ZenedgeClient> = {
  "unix socket (node:http)": () => new ZenedgeClient(new NodeTransport({ socketPath: info.socket })),
  "tcp + token (node:http)": () => new ZenedgeClient(new NodeTransport({ host, port, token })),
  "tcp + token (fetch, as in a webview)": () => new ZenedgeClient(new FetchTransport(`http://${info.tcp}`, token)),
};

const story: ChatCompletionRequest = {
  model: "p1", messages: [{ role: "user", content: "tell me a story" }], temperature: 0, max_tokens: 24,
};

async function waitForIdle(client: ZenedgeClient): Promise<Ps> {
  for (let i = 0; i < 600; i++) {
    const ps = await client.ps();
    if (ps.scheduler.running === 0 && ps.scheduler.queued === 0) return ps;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error("the daemon stayed busy");
}

for (const [name, make] of Object.entries(transports)) {
  describe(name, () => {
    const client = make();

    test("health and models", async () => {
      const health = await client.health();
      assert.equal(health.status, "ok");
      assert.equal(health.pid, info.pid);
      const ids = (await client.models()).data.map((m) => m.id);
      for (const id of ["tiny", "p0", "p1", "p2", "p3"]) assert.ok(ids.includes(id), id);
    });

    test("streamed chat equals the plain answer at temperature 0, usage last", async () => {
      const plain = await client.chat(story);
      let streamed = "";
      const chunks = [];
      for await (const chunk of client.chatStream({ ...story, stream_options: { include_usage: true } })) {
        chunks.push(chunk);
        streamed += chunk.choices[0]?.delta.content ?? "";
      }
      assert.equal(streamed, plain.choices[0].message.content);
      assert.deepEqual(chunks.at(-1)?.usage, plain.usage);
      assert.equal(chunks.at(-2)?.choices[0].finish_reason, plain.choices[0].finish_reason);
    });

    test("text completions", async () => {
      const request = { model: "p2", prompt: "Once upon a time", temperature: 0, max_tokens: 12 };
      const plain = await client.complete(request);
      let streamed = "";
      for await (const chunk of client.completeStream(request)) streamed += chunk.choices[0]?.text ?? "";
      assert.equal(streamed, plain.choices[0].text);
    });

    test("embeddings: one unit vector per input, per profile", async () => {
      const answer = await client.embeddings({ model: "p0", input: ["hello there", "general kenobi"] });
      assert.deepEqual(answer.data.map((d) => d.index), [0, 1]);
      for (const { embedding } of answer.data) {
        const vector = embedding as number[];
        assert.equal(vector.length, 64);
        assert.ok(Math.abs(vector.reduce((sum, x) => sum + x * x, 0) - 1) < 1e-5);
      }
      assert.equal(answer.usage.prompt_tokens, "hello there".length + "general kenobi".length);
      const base = await client.embeddings({ model: "tiny", input: "hello there" });
      assert.notDeepEqual(base.data[0].embedding, answer.data[0].embedding);
    });

    test("errors keep the daemon's status and code", async () => {
      await assert.rejects(client.chat({ ...story, model: "ghost" }), (error: unknown) => {
        assert.ok(error instanceof ZenedgeError);
        assert.equal(error.status, 404);
        assert.equal(error.code, "adapter_not_found");
        return true;
      });
      await assert.rejects(client.setBudget("lots", true), { status: 400, code: "invalid_input" });
    });
  });
}

describe("cancellation", () => {
  const client = new ZenedgeClient(new NodeTransport({ socketPath: info.socket }));
  const endless: ChatCompletionRequest = {
    model: "forever", messages: [{ role: "user", content: "go on" }], temperature: 0, max_tokens: 65536,
  };

  test("leaving a stream early cancels its generation", async () => {
    const before = (await waitForIdle(client)).scheduler.cancelled;
    let seen = 0;
    for await (const chunk of client.chatStream(endless)) {
      assert.ok(chunk.choices.length);
      if (++seen === 3) break;
    }
    const after = await waitForIdle(client);  // 65536 tokens would keep it busy for minutes
    assert.equal(after.scheduler.cancelled, before + 1);
  });

  test("an AbortSignal cancels too", async () => {
    const before = (await waitForIdle(client)).scheduler.cancelled;
    const controller = new AbortController();
    await assert.rejects(async () => {
      for await (const _ of client.chatStream(endless, { signal: controller.signal })) controller.abort();
    }, { name: "AbortError" });
    assert.equal((await waitForIdle(client)).scheduler.cancelled, before + 1);
  });
});

describe("security and discovery", () => {
  test("a wrong token is refused over TCP", async () => {
    for (const transport of [new NodeTransport({ host, port, token: "wrong" }), new FetchTransport(`http://${info.tcp}`, "wrong")]) {
      await assert.rejects(new ZenedgeClient(transport).ps(), { status: 401, code: "unauthorized" });
    }
  });

  test("nothing listening is DaemonUnavailable", async () => {
    const gone = new ZenedgeClient(new NodeTransport({ socketPath: `${home}/no-such.sock` }));
    await assert.rejects(gone.health(), (error: unknown) => error instanceof DaemonUnavailable && error.status === 0);
  });

  test("discover finds the running daemon through daemon.json", async () => {
    for (const preferTcp of [false, true]) {
      const client = await discover({ home, preferTcp });
      assert.ok(client, "not found");
      assert.equal((await client.health()).pid, info.pid);
      assert.match(client.transport.description, preferTcp ? /^http:/ : /^unix:/);
    }
    assert.equal(await discover({ home: `${home}/nowhere` }), null);
  });

  test("ensureDaemon reuses a running daemon instead of spawning", async () => {
    const client = await ensureDaemon({
      home, spawn: (() => { throw new Error("must not spawn"); }) as never,
    });
    assert.equal((await client.health()).pid, info.pid);
  });

  test("native endpoints", async () => {
    const client = (await discover({ home }))!;
    const listed = await client.list();
    assert.deepEqual(listed.models.map((m) => m.name), ["p0", "p1", "p2", "p3"]);
    const budget = await client.budget();
    assert.ok(budget.used_bytes > 0 && budget.budget_bytes >= budget.used_bytes);
    const plan = await client.setBudget("1B", true);
    assert.equal(plan.dry_run, true);
    assert.equal((await client.list()).models.length, 4);  // a dry run changes nothing
    const pool = await client.pool();
    assert.equal(pool.adapters, 4);
  });
});
