// `relay bench --peer graphile-worker`: the peer's side of each measurement, run by the node
// that `relay bench` installs under target/peer/. One command per process; each prints one JSON
// line on stdout. The schema is the run's own (GW_SCHEMA); the database is the bench's.
//
//   migrate            install graphile-worker's schema
//   add N              N noop jobs with addJobs, batches of 1000 (the bulk intake)
//   add-one SECONDS    one client, addJob one job at a time for SECONDS (the single intake)
//   run                runOnce: drain every job, concurrency 24, a pool of 25 connections (its documentation:
//                      at least the concurrency; the default is node-postgres's 10), localQueue 500, no batch delays
//
// Times are taken inside this process: from just before the library call to its return, so
// `run` includes the worker's own start-up (its pool, its first queries) as the issue measured.

import { Logger, makeWorkerUtils, runOnce } from "graphile-worker";

const connectionString = process.env.DATABASE_URL;
const schema = process.env.GW_SCHEMA;
const [command, arg] = process.argv.slice(2);
// Quiet: the figures are the output.
const logger = new Logger(() => () => {});

function print(value) {
  process.stdout.write(JSON.stringify(value) + "\n");
}

async function utils() {
  return makeWorkerUtils({ connectionString, schema, logger });
}

async function migrate() {
  const u = await utils();
  await u.migrate();
  await u.release();
  print({ ok: true });
}

async function add(n) {
  const u = await utils();
  const start = performance.now();
  for (let made = 0; made < n; made += 1000) {
    const count = Math.min(1000, n - made);
    const specs = Array.from({ length: count }, (_, i) => ({ identifier: "noop", payload: { i: made + i } }));
    await u.addJobs(specs);
  }
  const seconds = (performance.now() - start) / 1000;
  await u.release();
  print({ jobs: n, seconds });
}

async function addOne(secs) {
  const u = await utils();
  const until = performance.now() + secs * 1000;
  const start = performance.now();
  let n = 0;
  while (performance.now() < until) {
    await u.addJob("noop", { i: n });
    n += 1;
  }
  const seconds = (performance.now() - start) / 1000;
  await u.release();
  print({ jobs: n, seconds });
}

async function run() {
  let done = 0;
  const taskList = { noop: async () => { done += 1; } };
  const start = performance.now();
  await runOnce({
    connectionString,
    schema,
    logger,
    concurrency: 24,
    noHandleSignals: true,
    taskList,
    preset: {
      worker: {
        maxPoolSize: 25,
        localQueue: { size: 500 },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
  });
  const seconds = (performance.now() - start) / 1000;
  print({ jobs: done, seconds });
}

switch (command) {
  case "migrate": await migrate(); break;
  case "add": await add(Number(arg)); break;
  case "add-one": await addOne(Number(arg)); break;
  case "run": await run(); break;
  default:
    process.stderr.write(`unknown command ${command}\n`);
    process.exit(2);
}
