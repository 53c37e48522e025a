// swift-tools-version:6.0
import PackageDescription

/// One executable per documented listing (shared/LISTINGS.md), run with
/// `swift run Example<Name>`.
let examples: [String] = [
  "ExampleQueueFinalizer",
  "ExampleAsyncSync",
  "ExampleCompletionBlock",
  "ExampleConcurrentLoop",
  "ExampleSemaphore",
  "ExampleGroupWait",
  "ExampleAfter",
  "ExampleSuspendResume",
  "ExampleTargetQueue",
  "ExampleFunctionHandlers",
  "ExampleMainQueue",
  "ExampleTimer",
  "ExampleReadFile",
  "ExampleWriteFile",
  "ExampleSignal",
  "ExampleRemoveSource",
  "ExampleDataAdd",
  "ExampleProgress",
  "ExampleMonitorParent",
  "ExampleMonitorRename",
  "ExampleCat",
  "ExampleEchoServer",
]

let package = Package(
  name: "GCD",
  products: [
    .library(name: "GCD", targets: ["GCD"])
  ],
  targets: [
    .target(name: "CGCD", linkerSettings: [.linkedLibrary("BlocksRuntime")]),
    .target(name: "GCD", dependencies: ["CGCD"]),
    .testTarget(name: "GCDTests", dependencies: ["GCD", "CGCD"]),
    // `make bench`: GCD against libdispatch from C (Benchmarks/c, built by the
    // Makefile) and against the toolchain's `Dispatch`. See docs/performance.md.
    .executableTarget(name: "GCDBenchmarks", dependencies: ["GCD"], path: "Benchmarks/GCDBenchmarks"),
  ]
    + examples.map {
      .executableTarget(
        name: $0, dependencies: ["GCD"], path: "Examples/\($0.dropFirst("Example".count))")
    },
  swiftLanguageModes: [.v6]
)
