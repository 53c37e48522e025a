// swift-tools-version:6.1
// The SwiftNIO twin of `GCDBenchmarks --http-server` (issue 41): a separate package so that the GCD
// package itself never depends on swift-nio. Build it with `Benchmarks/NIOTwin/mirror.sh` (which
// points these URLs at local mirrors) and measure it with `VARIANTS=nio Benchmarks/http.sh`.
import PackageDescription

let package = Package(
  name: "NIOTwin",
  platforms: [.macOS(.v15)],  // Synchronization.Atomic
  dependencies: [
    .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.3")
  ],
  targets: [
    .executableTarget(
      name: "NIOTwin",
      dependencies: [
        .product(name: "NIOCore", package: "swift-nio"),
        .product(name: "NIOPosix", package: "swift-nio"),
        .product(name: "NIOHTTP1", package: "swift-nio"),
      ]
    )
  ]
)
