/**
 * A typed Treadle client for TypeScript: openapi-fetch over the types openapi-typescript
 * generates from openapi/openapi.json (`npm run generate`; docs/clients.md).
 *
 * Every call is checked against the spec at compile time (paths, parameters, bodies,
 * answers). Errors come back as RFC 9457 problems (`code`, `status`, `title`, `detail`);
 * `TreadleError` carries them.
 */
import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "./schema.js";

export type Run = components["schemas"]["Run"];
export type RunResult = components["schemas"]["RunResult"];
export type Problem = components["schemas"]["Problem"];
export type SubmitRunRequest = components["schemas"]["SubmitRunRequest"];

/** An error answer of the API: the problem's stable `code`, HTTP `status`, `detail`. */
export class TreadleError extends Error {
  readonly code: string;
  readonly status: number;
  readonly title: string;
  readonly detail: string;

  constructor(problem: Problem) {
    super(`${problem.status} ${problem.code}: ${problem.detail}`);
    this.name = "TreadleError";
    this.code = problem.code;
    this.status = problem.status;
    this.title = problem.title;
    this.detail = problem.detail;
  }
}

/** How many times a 429/503 answer is retried, and the longest wait between two (ms). */
const MAX_RETRIES = 3;
const MAX_RETRY_WAIT_MS = 30_000;

/**
 * Retry 429/503 answers after their `Retry-After` (seconds): the server changed nothing
 * (docs/operations.md, database faults), so the same request may be sent again.
 */
function retryAfter(fetchImpl: typeof fetch): Middleware {
  const bodies = new WeakMap<Request, ArrayBuffer>();
  return {
    async onRequest({ request }) {
      if (request.body !== null) bodies.set(request, await request.clone().arrayBuffer());
      return undefined;
    },
    async onResponse({ request, response }) {
      let answer = response;
      for (let attempt = 0; attempt < MAX_RETRIES; attempt++) {
        if (answer.status !== 503 && answer.status !== 429) return answer;
        const seconds = Number(answer.headers.get("retry-after") ?? "NaN");
        const wait = Number.isFinite(seconds) ? seconds * 1000 : 500 * 2 ** attempt;
        await new Promise((resolve) => setTimeout(resolve, Math.min(Math.max(wait, 0), MAX_RETRY_WAIT_MS)));
        const body = bodies.get(request);
        answer = await fetchImpl(new Request(request, body === undefined ? {} : { body }));
      }
      return answer;
    },
  };
}

/** A client for `baseUrl` authenticated with a bearer token (JWT or API key). */
export function treadleClient(baseUrl: string, token: string, fetchImpl: typeof fetch = fetch) {
  const client = createClient<paths>({
    baseUrl,
    headers: { Authorization: `Bearer ${token}` },
    fetch: fetchImpl,
  });
  client.use(retryAfter(fetchImpl));
  return client;
}

export type TreadleClient = ReturnType<typeof treadleClient>;

/** Submit a run and long-poll its result until it is terminal (completed or not). */
export async function execute(
  client: TreadleClient,
  body: SubmitRunRequest,
  waitSeconds = 60,
): Promise<RunResult> {
  const submitted = await client.POST("/runs", { body });
  if (submitted.error !== undefined) throw new TreadleError(submitted.error);
  const runId = submitted.data.run_id;
  for (;;) {
    const polled = await client.GET("/runs/{run_id}/result", {
      params: { path: { run_id: runId }, query: { wait: waitSeconds } },
    });
    if (polled.error !== undefined) throw new TreadleError(polled.error);
    if (polled.data.done) return polled.data;
  }
}

/** The operator's report as text (`GET /runs/{run_id}/report.txt`). */
export async function reportText(client: TreadleClient, runId: string): Promise<string> {
  const answer = await client.GET("/runs/{run_id}/report.txt", {
    params: { path: { run_id: runId } },
    parseAs: "text",
  });
  if (answer.error !== undefined) throw new TreadleError(answer.error);
  return answer.data;
}
