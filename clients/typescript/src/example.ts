/**
 * Submit one run from Node and wait for it: `node dist/example.js WORKFLOW 'INPUT-JSON'`.
 * Reads TREADLE_URL and TREADLE_TOKEN; prints one JSON line (result, report size, and the
 * problem code of an unknown run), exits 1 unless the run completed.
 */
import { execute, reportText, treadleClient, TreadleError } from "./treadle.js";

const [workflow, inputJson] = process.argv.slice(2);
const token = process.env.TREADLE_TOKEN;
if (workflow === undefined || token === undefined) {
  console.error("usage: TREADLE_TOKEN=… node dist/example.js WORKFLOW [INPUT-JSON]");
  process.exit(2);
}
const client = treadleClient(process.env.TREADLE_URL ?? "http://127.0.0.1:8000", token);
const input: unknown = JSON.parse(inputJson ?? "{}");

const result = await execute(client, { workflow, input });
const report = await reportText(client, result.run_id);
let missing = "";
try {
  await reportText(client, "no such run?#");  // one quoted path segment: 404 run_not_found
} catch (err) {
  if (!(err instanceof TreadleError)) throw err;
  missing = err.code;
}
console.log(JSON.stringify({ result, reportLines: report.split("\n").length, report, missing }));
process.exit(result.status === "completed" ? 0 : 1);
