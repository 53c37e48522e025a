// swift-tools-version:6.0
import PackageDescription

/// One executable target per folder `Examples/<Name>` (its `main.swift`), run with
/// `swift run Example<Name>`: the documented listings (shared/LISTINGS.md) and the features' examples.
/// Listed by name, not found by listing the folder: SwiftPM caches the evaluated manifest by its
/// text, so a folder found at evaluation time would silently stay missing after it is added.
/// `ExamplesTests.everyFolderIsATarget` fails when a folder and this list differ.
let examples: [String] = [
  "ExampleActorQueue",
  "ExampleAfter",
  "ExampleAsyncSync",
  "ExampleBuildPipeline",
  "ExampleCat",
  "ExampleCompletionBlock",
  "ExampleConcurrentLoop",
  "ExampleDataAdd",
  "ExampleEchoServer",
  "ExampleFileWatcher",
  "ExampleFunctionHandlers",
  "ExampleGracefulShutdown",
  "ExampleGroupWait",
  "ExampleMainActorThread",
  "ExampleMainQueue",
  "ExampleMemoryPressure",
  "ExampleMonitorParent",
  "ExampleMonitorRename",
  "ExampleProgress",
  "ExampleQueueFinalizer",
  "ExampleReadFile",
  "ExampleRemoveSource",
  "ExampleSemaphore",
  "ExampleSignal",
  "ExampleSignalService",
  "ExampleStallReport",
  "ExampleSupervisor",
  "ExampleSuspendResume",
  "ExampleTargetQueue",
  "ExampleTimer",
  "ExampleTour",
  "ExampleWriteFile",
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
    // Imports Foundation (which re-exports Dispatch) beside GCD and uses every contract name
    // unqualified: a name that clashes with Dispatch's stops it from compiling.
    .testTarget(name: "GCDFoundationTests", dependencies: ["GCD"]),
    // Differential tests: seeded operation sequences run through `import Dispatch` (the oracle)
    // and through GCD, the observations compared (docs/reliability.md, "Differential tests").
    .testTarget(name: "GCDDifferentialTests", dependencies: ["GCD"]),
    // `make bench`: GCD against libdispatch from C (Benchmarks/c, built by the
    // Makefile) and against the toolchain's `Dispatch`. See docs/performance.md.
    .executableTarget(name: "GCDBenchmarks", dependencies: ["GCD"], path: "Benchmarks/GCDBenchmarks"),
  ]
    + examples.map {
      .executableTarget(name: $0, dependencies: ["GCD"], path: "Examples/\($0.dropFirst("Example".count))")
    },
  swiftLanguageModes: [.v6]
)
