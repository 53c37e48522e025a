import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// What a C-convention test function records about its calls; handed over as
/// an unretained context pointer (the test keeps it alive).
final class FunctionCall: Sendable {
  let count = Counter()
  let done = Event()
  let calledAt = Mutex<Deadline?>(nil)
  let observing: Counter?
  let observed = Mutex<Int?>(nil)

  init(observing: Counter? = nil) { self.observing = observing }

  var pointer: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }
}

/// A C-convention function that records its call in the `FunctionCall` its
/// context points to.
func recordCall(_ context: UnsafeMutableRawPointer?) {
  guard let context else {
    Issue.record("the C function got a nil context")
    return
  }
  let call = Unmanaged<FunctionCall>.fromOpaque(context).takeUnretainedValue()
  call.calledAt.withLock { $0 = .now }
  if let observing = call.observing { call.observed.withLock { $0 = observing.current } }
  call.count.increment()
  call.done.signal()
}

/// A C-convention function that does nothing.
func doNothing(_ context: UnsafeMutableRawPointer?) {}

/// Nanoseconds since the Unix epoch on the wall clock (`CLOCK_REALTIME`).
func wallClockNanoseconds() -> Int64 {
  var now = timespec()
  clock_gettime(CLOCK_REALTIME, &now)
  return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
}
