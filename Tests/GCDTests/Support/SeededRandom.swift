/// A small seeded generator (SplitMix64) for the property tests: the same
/// seed gives the same sequence on every machine, so a failure's seed,
/// printed in its message, replays it (`GCD_PROPERTY_SEED=<seed>`).
struct SeededRandom: RandomNumberGenerator {
  private var state: UInt64

  init(seed: UInt64) { state = seed }

  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var mixed = state
    mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
    mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
    return mixed ^ (mixed >> 31)
  }

  /// The seed of this run: `GCD_PROPERTY_SEED` when set, else a fresh one.
  static var runSeed: UInt64 {
    if let text = ProcessInfoLite.environment("GCD_PROPERTY_SEED"), let seed = UInt64(text) { return seed }
    var system = SystemRandomNumberGenerator()
    return system.next()
  }
}

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// An environment variable, without Foundation.
enum ProcessInfoLite {
  static func environment(_ name: String) -> String? {
    guard let value = getenv(name) else { return nil }
    return String(cString: value)
  }
}
