import Dispatch
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// GCDBenchmarks: every operation in three variants — C (libdispatch from
// plain C, the floor), GCD (this package) and Dispatch (the toolchain's
// overlay) — interleaved in one process. `make bench` builds the C part and
// runs this in release mode. See docs/performance.md.

let usage = """
  usage: GCDBenchmarks [options]
    --filter SUBSTRING   only the operations (and memory rows) whose name contains SUBSTRING
    --only NAME[,NAME…]  only the operations (or memory rows, or scale curves) named; an unknown name is
                         an error, as is a selection that matches nothing
    --quick              every operation once with a tiny count, for CI (exits 0; numbers mean nothing)
    --repeats N          timed runs per variant (default: the operation's own, else 7)
    --count N            operations per timed run, for every operation (default: each its own)
    --variant NAME       only this variant (C, GCD or Dispatch); may be repeated
    --json               JSON on standard output instead of the table and the op= lines
    --svg FILE           also write a bar chart of the ratios to FILE
    --doc FILE           also write the operations table into FILE's <!-- bench:begin --> … <!-- bench:end -->
                         block (all three variants; with --only or --filter, those rows alone)
    --no-memory          skip the memory measurements
    --c-lib PATH         the C library (default: $GCD_BENCH_C_LIB, else \(CLibrary.defaultPath))
    --list               list the operations and exit
    --scale              the scale curves instead (docs/performance.md, "Scale"); --filter, --only,
                         --variant and --quick apply (--quick: two small N each, exit 1 when a target breaks)
    --charts DIR         with --scale: write one log-log SVG chart per curve into DIR
    --scale-doc FILE     with --scale: replace FILE's <!-- scale:begin --> … <!-- scale:end --> section

  """

struct Options {
  var filter: String?
  var only: [String]?
  var quick = false
  /// Timed runs per variant when given; otherwise each operation's own, else 7.
  var repeats: Int?
  var count: Int?
  var variants: [Variant] = []
  var json = false
  var svgPath: String?
  var document: String?
  var memory = true
  var libraryPath: String?
  var list = false
  var scale = false
  var chartFolder: String?
  var scaleDocument: String?
  /// Internal: run one peak-RSS workload and print the peak RSS before and after.
  var rssChild: (RSSWorkload, Variant, Int)?
}

func parseOptions(_ arguments: [String]) -> Options {
  var options = Options()
  var remaining = arguments[...]
  func value(_ flag: String) -> String {
    guard let value = remaining.popFirst() else { fail("\(flag) needs a value") }
    return value
  }
  func fail(_ message: String) -> Never {
    note("GCDBenchmarks: \(message)\n\n\(usage)")
    exit(2)
  }
  while let argument = remaining.popFirst() {
    switch argument {
    case "--filter": options.filter = value(argument)
    case "--only":
      let names = value(argument).split(separator: ",").map { String($0).trimmingCharacters() }.filter { !$0.isEmpty }
      guard !names.isEmpty else { fail("--only needs one name or more, separated by commas") }
      options.only = (options.only ?? []) + names
    case "--quick": options.quick = true
    case "--repeats":
      guard let repeats = Int(value(argument)), repeats > 0 else { fail("--repeats needs a positive number") }
      options.repeats = repeats
    case "--count":
      guard let count = Int(value(argument)), count > 0 else { fail("--count needs a positive number") }
      options.count = count
    case "--variant":
      let name = value(argument)
      guard let variant = Variant.allCases.first(where: { $0.rawValue.lowercased() == name.lowercased() }) else {
        fail("unknown variant \(name)")
      }
      options.variants.append(variant)
    case "--json": options.json = true
    case "--svg": options.svgPath = value(argument)
    case "--doc": options.document = value(argument)
    case "--no-memory": options.memory = false
    case "--c-lib": options.libraryPath = value(argument)
    case "--list": options.list = true
    case "--scale": options.scale = true
    case "--charts": options.chartFolder = value(argument)
    case "--scale-doc": options.scaleDocument = value(argument)
    case "--rss-child":
      guard let workload = RSSWorkload(rawValue: value(argument)),
        let variant = Variant(rawValue: value(argument)), let count = Int(value(argument))
      else { fail("bad --rss-child arguments") }
      options.rssChild = (workload, variant, count)
    case "--help", "-h":
      print(usage, terminator: "")
      exit(0)
    default: fail("unknown argument \(argument)")
    }
  }
  if options.variants.isEmpty { options.variants = Variant.allCases }
  return options
}

// The nested-epoll probes (ChurnProbe.swift) take over the process when asked for.
runChurnProbeIfAsked()
let options = parseOptions(Array(CommandLine.arguments.dropFirst()))

// The C library: --c-lib, else $GCD_BENCH_C_LIB (set by `make bench`), else the default path.
let libraryPath =
  options.libraryPath ?? getenv("GCD_BENCH_C_LIB").map { String(cString: $0) } ?? CLibrary.defaultPath
let library = CLibrary(path: libraryPath)
let fixtures = SourceFixtures()
let factory = ObjectFactory(
  library: library, fixtures: fixtures, queue: Queue(label: "bench.memory"),
  dispatchQueue: DispatchQueue(label: "bench.memory"))

if let (workload, variant, count) = options.rssChild {
  // Child side of the peak-RSS measurement.
  if let (before, after) = runRSSWorkload(workload, variant: variant, count: count, factory: factory) {
    print("before_kib=\(before) after_kib=\(after)")
  } else {
    print("status=n/a")
  }
  exit(0)
}

if library == nil && options.variants.contains(.c) {
  note("GCDBenchmarks: no C library at \(libraryPath): the C column says \"\(CLibrary.missing)\"")
}

func selected(_ name: String) -> Bool {
  (options.filter.map { name.contains($0) } ?? true) && (options.only.map { $0.contains(name) } ?? true)
}

/// Stops (status 2) when `--only` names something `names` lacks, or when `--only` and `--filter`
/// select nothing of `names`: a run that would measure nothing, or less than asked, is refused
/// rather than reported (and never rewrites a document).
func checkSelection(of names: [String], what: String) {
  if let only = options.only {
    let unknown = only.filter { !names.contains($0) }
    if !unknown.isEmpty {
      note(
        "GCDBenchmarks: unknown \(what): \(unknown.joined(separator: ", ")); the \(what) are: \(names.joined(separator: ", "))"
      )
      exit(2)
    }
  }
  if !names.contains(where: selected) {
    note(
      "GCDBenchmarks: --filter \(options.filter ?? "") selects none of the \(what): \(names.joined(separator: ", "))")
    exit(2)
  }
}

/// Whether the selection is a part of `names` rather than all of them.
func selectsPart(of names: [String]) -> Bool { !names.allSatisfy(selected) }

if options.scale {
  let names = scaleRows(library, sockets: ScaleSockets(pairs: 0)).map(\.name)
  checkSelection(of: names, what: "scale curves")
  runScale(
    library: library, variants: options.variants, quick: options.quick, selected: selected,
    chartFolder: options.chartFolder, document: options.scaleDocument, partial: selectsPart(of: names))
}

let benchmarks =
  queueBenchmarks(library) + synchronizationBenchmarks(library) + applyBenchmarks(library, quick: options.quick)
  + sourceBenchmarks(library, fixtures: fixtures) + workItemBenchmarks(library) + ioBenchmarks(library)
  + concurrencyBenchmarks(heapInUse: library?.heapInUse) + stallBenchmarks(library)

let operationNames =
  benchmarks.map(\.name) + ObjectKind.allCases.map { "mem_" + $0.name }
  + RSSWorkload.allCases.map { "rss_" + $0.rawValue }
if !options.list { checkSelection(of: operationNames, what: "operations") }

// --doc: refused before anything runs when the run could not give the table's figures, or the
// document has no block to write them into; a refused run never touches the document.
if let document = options.document, !options.list {
  func refuse(_ why: String) -> Never {
    note("GCDBenchmarks: --doc \(document): \(why); nothing run, the document left as it was")
    exit(2)
  }
  if options.scale { refuse("--scale writes its own section (--scale-doc)") }
  if options.quick { refuse("--quick's numbers mean nothing") }
  if options.count != nil { refuse("--count changes what a row measures") }
  if Set(options.variants) != Set(Variant.allCases) { refuse("the table needs all three variants") }
  if BenchDocument.block(in: document) == nil { refuse("no block to write into") }
}

if options.list {
  for benchmark in benchmarks { print("\(benchmark.name)  \(benchmark.title)") }
  for kind in ObjectKind.allCases { print("mem_\(kind.name)  heap bytes per live \(kind.name)") }
  for workload in RSSWorkload.allCases { print("rss_\(workload.rawValue)  peak RSS: \(workload.title)") }
  exit(0)
}

var results: [BenchmarkResult] = []
for benchmark in benchmarks where selected(benchmark.name) {
  note("running \(benchmark.name)")
  results.append(
    measure(
      benchmark, variants: options.variants, repeats: options.repeats ?? benchmark.repeats ?? 7, quick: options.quick,
      countOverride: options.count, heapInUse: library?.heapInUse))
}

let objectCount = options.quick ? 10 : 2_000
var objects: [ObjectMemory] = []
var peaks: [RSSResult] = []
if options.memory {
  let kinds = ObjectKind.allCases.filter { selected("mem_" + $0.name) }
  if !kinds.isEmpty {
    note("measuring heap bytes per object")
    objects = measureObjects(factory, kinds: kinds, variants: options.variants, count: objectCount)
  }
  let workloads = RSSWorkload.allCases.filter { selected("rss_" + $0.rawValue) }
  if !workloads.isEmpty {
    note("measuring peak RSS in child processes")
    peaks = measureRSS(
      workloads: workloads, variants: options.variants, quick: options.quick,
      libraryPath: library?.path)
  }
}

let report = Report(
  machine: .current(), repeats: options.repeats ?? 7, quick: options.quick, results: results, objects: objects,
  objectCount: objectCount,
  objectsMissing: options.memory && library == nil ? "needs the C library, " + CLibrary.missing : nil, rss: peaks)
if options.json {
  print(report.json, terminator: "")
} else {
  print(report.table)
  print(report.lines, terminator: "")
}
if let document = options.document, results.isEmpty {
  note("GCDBenchmarks: no operation row measured (memory rows are not in the table); \(document) left as it was")
} else if let document = options.document {
  if BenchDocument.write(report, to: document, partial: selectsPart(of: benchmarks.map(\.name))) {
    note("wrote \(results.map(\.benchmark.name).joined(separator: ", ")) in the bench block of \(document)")
  } else {
    exit(1)
  }
}
if let svgPath = options.svgPath {
  guard let file = fopen(svgPath, "w") else {
    note("GCDBenchmarks: cannot write \(svgPath)")
    exit(1)
  }
  fputs(report.svg, file)
  fclose(file)
  note("wrote \(svgPath)")
}
exit(0)

extension String {
  /// Without leading and trailing spaces.
  func trimmingCharacters() -> String {
    var text = Substring(self)
    while text.first == " " { text.removeFirst() }
    while text.last == " " { text.removeLast() }
    return String(text)
  }
}
