// Reproduces the progress-bar example of the custom-source article: a `DISPATCH_SOURCE_TYPE_DATA_ADD`
// source on the main queue; 100 tasks on the default global queue each `usleep(20000)` and then
// `dispatch_source_merge_data(source, 1)`; the handler adds `dispatch_source_get_data` to
// `totalComplete` and logs the progress, `totalComplete / 100`.
//
// On Linux: the same calls; `Queue.dispatchMain()` drains the main queue and the handler ends the program with
// `exit(0)` at 1.0. The handler stands for a progress-bar redraw and takes a while (an argument): the
// merges that come meanwhile are merged into its next call, so it runs far fewer than 100 times.
//
// Usage: ExampleProgress [tasks, default 100] [ms a task sleeps, default 20] [ms a redraw takes, default 50]

import GCD
import Glibc
import Synchronization

let arguments = CommandLine.arguments.dropFirst().compactMap { Int($0) }
let taskCount = arguments.first ?? 100
let sleepMicroseconds = UInt32(arguments.dropFirst().first ?? 20) * 1000
let redrawMicroseconds = UInt32(arguments.dropFirst(2).first ?? 50) * 1000

let source = DataAddSource(queue: .main)
/// `totalComplete`, and how many times the handler ran.
let state = Mutex((totalComplete: UInt(0), calls: 0))

source.setEventHandler {
  // Every merge since the handler last ran, added up.
  let value = source.data
  let (totalComplete, calls) = state.withLock { state in
    state = (state.totalComplete + value, state.calls + 1)
    return state
  }
  print("progress: \(Double(totalComplete) / Double(taskCount)) (+\(value))")
  usleep(redrawMicroseconds)  // redraws the progress bar
  if totalComplete == taskCount {
    print("\(calls) handler calls for \(taskCount) merges")
    exit(0)
  }
}
// A source starts suspended: resume it before it can deliver anything.
source.resume()

let queue = Queue.global(.default)
for _ in 0..<taskCount {
  queue.async {
    usleep(sleepMicroseconds)
    source.merge(1)
  }
}
Queue.dispatchMain()
