// Reproduces the custom-source article: a `DISPATCH_SOURCE_TYPE_DATA_ADD` source on the main queue whose
// handler logs `dispatch_source_get_data`, and a loop on the default global queue that calls
// `dispatch_source_merge_data(source, i)` for i = 1…4; then the same with `DATA_OR`; then with the
// merges spaced out, so that each arrives alone.
//
// On Linux: the same calls. `Queue.dispatchMain()` drains the main queue (there is no UIKit run loop) and the
// last handler ends the program with `exit(0)`. Instead of the article's 1 s sleep, the spaced loop waits
// after each merge until the main queue has run the handler (`Queue.main.sync {}`).

import GCD
import Glibc
import Synchronization

/// The article's loop on the default global queue; `spaced` waits for the handler after each merge.
func mergeOneToFour(spaced: Bool = false, _ merge: @escaping @Sendable (UInt) -> Void) {
  Queue.global(.default).async {
    for i in 1...4 {
      print("~~~~~~~~~~~~~~\(i)")
      merge(UInt(i))
      if spaced { Queue.main.sync {} }
    }
  }
}

/// What the current run's handler has seen so far, combined (handlers run only on the main queue).
let seen = Mutex<UInt>(0)

/// Logs `data` and combines it with what the run saw before; true once that reaches `end`.
func handle(_ name: String, _ data: UInt, _ combine: (UInt, UInt) -> UInt, until end: UInt) -> Bool {
  print("\(name) handler: \(data)")
  guard
    seen.withLock({
      $0 = combine($0, data); return $0
    }) == end
  else { return false }
  print("\(name): the values the handler saw combine to \(end)")
  seen.withLock { $0 = 0 }
  return true
}

let addSource = DataAddSource(queue: .main)
let orSource = DataOrSource(queue: .main)
let spacedSource = DataAddSource(queue: .main)
addSource.setEventHandler {
  if handle("DATA_ADD", addSource.data, +, until: 10) { mergeOneToFour { orSource.merge($0) } }
}
orSource.setEventHandler {
  if handle("DATA_OR", orSource.data, |, until: 7) { mergeOneToFour(spaced: true) { spacedSource.merge($0) } }
}
spacedSource.setEventHandler {
  if handle("DATA_ADD, spaced", spacedSource.data, +, until: 10) { exit(0) }
}
addSource.resume()
orSource.resume()
spacedSource.resume()

mergeOneToFour { addSource.merge($0) }
Queue.dispatchMain()
