// Reproduces the custom-source article (`DISPATCH_SOURCE_TYPE_DATA_ADD` / `DATA_OR`): a source on the
// main queue whose handler logs `dispatch_source_get_data`, and a loop on the default global queue that
// calls `dispatch_source_merge_data(source, i)` for i = 1…4 — fast (merged into one call with 10, or 7
// for DATA_OR), then with a pause between merges (each value arrives alone).
//
// On Linux: the same calls. The main queue is drained by `dispatchMain()` (there is no UIKit run loop)
// and the program ends with `exit(0)`; the article's 1 s pause is an argument with a 100 ms default.
//
// Usage: ExampleDataAdd [pause between the spaced merges in milliseconds, default 100]

import GCD
import Glibc
import Synchronization

let pauseMilliseconds = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 100 : 100

/// What the handlers have seen in the current run.
struct Run {
  var seen: [UInt] = []
  var combined: UInt = 0
}
let current = Mutex(Run())

/// The three runs: the fast loop on DATA_ADD, the fast loop on DATA_OR, the spaced loop on DATA_ADD.
let fastAdd = DataAddSource(queue: .main)
let fastOr = DataOrSource(queue: .main)
let spacedAdd = DataAddSource(queue: .main)

/// The article's loop, on the default global queue.
func mergeOneToFour(_ merge: @escaping @Sendable (UInt) -> Void, pause: Bool) {
  Queue.global().async {
    for i in 1...4 {
      print("~~~~~~~~~~~~~~\(i)")
      merge(UInt(i))
      if pause { usleep(UInt32(pauseMilliseconds * 1000)) }
    }
  }
}

/// The end of a run: prints what the handlers saw, then starts the next run (or ends the program).
func finish(_ name: String, expected: UInt, operation: String, next: () -> Void) {
  let run = current.withLock { run in
    defer { run = Run() }
    return run
  }
  print(
    "\(name): handler calls \(run.seen.count), data seen \(run.seen), \(operation) of what was seen: \(run.combined) (expected \(expected))"
  )
  next()
}

fastAdd.setEventHandler {
  let data = fastAdd.data
  print("handler (DATA_ADD): \(data)")
  let total = current.withLock { run in
    run.seen.append(data)
    run.combined += data
    return run.combined
  }
  guard total == 10 else { return }
  finish("fast DATA_ADD", expected: 10, operation: "sum") {
    print("-- DATA_OR, fast loop")
    mergeOneToFour({ fastOr.merge($0) }, pause: false)
  }
}

fastOr.setEventHandler {
  let data = fastOr.data
  print("handler (DATA_OR): \(data)")
  let bits = current.withLock { run in
    run.seen.append(data)
    run.combined |= data
    return run.combined
  }
  guard bits == 7 else { return }
  finish("fast DATA_OR", expected: 7, operation: "OR") {
    print("-- DATA_ADD, \(pauseMilliseconds) ms between merges")
    mergeOneToFour({ spacedAdd.merge($0) }, pause: true)
  }
}

spacedAdd.setEventHandler {
  let data = spacedAdd.data
  print("handler (DATA_ADD): \(data)")
  let (total, seen) = current.withLock { run in
    run.seen.append(data)
    run.combined += data
    return (run.combined, run.seen)
  }
  guard total == 10 else { return }
  finish("spaced DATA_ADD", expected: 10, operation: "sum") {
    print("spaced merges arrived one by one (1, 2, 3, 4): \(seen == [1, 2, 3, 4])")
    exit(0)
  }
}

fastAdd.resume()
fastOr.resume()
spacedAdd.resume()

print("-- DATA_ADD, fast loop")
mergeOneToFour({ fastAdd.merge($0) }, pause: false)
dispatchMain()
