/// The generator's only source of randomness: SplitMix64 (Steele, Lea and Flood), 64 bits of state,
/// so a sequence is replayed from its seed alone, on any machine, with no outside package.
struct SplitMix64: RandomNumberGenerator {
  private var state: UInt64

  init(seed: UInt64) { state = seed }

  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }

  /// A uniform value in `0..<bound`.
  mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }

  /// True with probability `percent` / 100.
  mutating func chance(_ percent: Int) -> Bool { below(100) < percent }

  /// One of `choices`, weighted by its `Int`.
  mutating func weighted<T>(_ choices: [(Int, T)]) -> T {
    var pick = below(choices.reduce(0) { $0 + $1.0 })
    for (weight, value) in choices {
      if pick < weight { return value }
      pick -= weight
    }
    return choices[choices.count - 1].1
  }

  /// The seed of sequence `index` of a run seeded `base`: sequence 0 is `base` itself, so the seed
  /// a failure prints replays that sequence alone with `COUNT=1`.
  static func sequenceSeed(base: UInt64, index: Int) -> UInt64 {
    var mixer = SplitMix64(seed: base &+ UInt64(index) &* 0xD1B5_4A32_D192_ED03)
    return index == 0 ? base : mixer.next()
  }
}
