// swift-tools-version:6.0
import Foundation
import PackageDescription

/// One executable per documented listing (shared/LISTINGS.md): each folder `Examples/<Name>` that holds
/// a `main.swift` is the target `Example<Name>`, run with `swift run Example<Name>`. SwiftPM caches
/// the evaluated manifest by its text, so after adding or removing a folder run
/// `swift package purge-cache` once. (Where the folder cannot be listed, as for a package evaluated
/// away from its checkout, there are no examples: the library does not need them.)
let examplesPath = Context.packageDirectory + "/Examples"
let examples = ((try? FileManager.default.contentsOfDirectory(atPath: examplesPath)) ?? [])
  .filter { FileManager.default.fileExists(atPath: "\(examplesPath)/\($0)/main.swift") }
  .sorted()

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
    + examples.map { .executableTarget(name: "Example\($0)", dependencies: ["GCD"], path: "Examples/\($0)") },
  swiftLanguageModes: [.v6]
)
