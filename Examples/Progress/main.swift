// Reproduces the progress-bar example of the custom-source article: a `DISPATCH_SOURCE_TYPE_DATA_ADD`
// source on the main queue; 100 tasks on the default global queue each `usleep(20000)` and then
// `dispatch_source_merge_data(source, 1)`; the handler adds `dispatch_source_get_data` to
// `totalComplete` and logs the progress `totalComplete / 100`.
//
// On Linux: the same calls; the main queue is drained by `dispatchMain()` and the program ends with
// `exit(0)` at 100 %. A 2-core machine runs only a few tasks at once, so the handler stands for a real
// progress-bar redraw and takes a while (argument); merges that arrive meanwhile are coalesced, and the
// bar is redrawn far fewer than 100 times, yet the total is exact.
//
// Usage: ExampleProgress [tasks, default 100] [ms each task sleeps, default 20] [ms a redraw takes, default 50]

import GCD
import Glibc
import Synchronization

let arguments = CommandLine.arguments
let taskCount = arguments.count > 1 ? Int(arguments[1]) ?? 100 : 100
let sleepMilliseconds = arguments.count > 2 ? Int(arguments[2]) ?? 20 : 20
let redrawMilliseconds = arguments.count > 3 ? Int(arguments[3]) ?? 50 : 50

let source = DataAddSource(queue: .main)
/// `totalComplete` and the number of handler calls; touched only by the handler, on the main queue.
let totalComplete = Mutex<(completed: UInt, calls: Int)>((0, 0))

source.setEventHandler {
  // The merged value: every merge since the last call of the handler, added up.
  let value = source.data
  let (completed, calls) = totalComplete.withLock { state in
    state.completed += value
    state.calls += 1
    return state
  }
  let progress = Double(completed) / Double(taskCount)
  print("progress: \(progress) (+\(value))")
  usleep(UInt32(redrawMilliseconds * 1000))  // redrawing the progress bar
  if completed == UInt(taskCount) {
    print("progress reached exactly 1.0: \(progress == 1.0)")
    print("handler calls: \(calls) for \(taskCount) merges (coalesced: \(calls < taskCount))")
    exit(0)
  }
}

// The source is created inactive: resume it before it can deliver anything.
source.resume()

let queue = Queue.global()
for _ in 0..<taskCount {
  queue.async {
    usleep(UInt32(sleepMilliseconds * 1000))
    source.merge(1)
  }
}
print(
  "\(taskCount) tasks submitted, each sleeps \(sleepMilliseconds) ms then merges 1; a redraw takes \(redrawMilliseconds) ms"
)
dispatchMain()
