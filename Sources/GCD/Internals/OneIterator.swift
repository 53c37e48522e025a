import Synchronization

/// The state of a sequence with one iterator (a source's events, a signal sequence): whether the
/// iterator was made. A sequence dropped before it made one ends (its owner's `deinit`); a second
/// one is refused.
protocol OneIteratorState {
  /// An iterator was made (the sequence's drop no longer ends it).
  var iterated: Bool { get set }
}

extension Mutex where Value: OneIteratorState {
  /// Makes the one iterator; false for a second one.
  func claimIterator() -> Bool {
    withLock { state in
      defer { state.iterated = true }
      return !state.iterated
    }
  }

  /// Whether the one iterator was made.
  var isIterated: Bool { withLock { $0.iterated } }
}
