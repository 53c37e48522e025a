// Reproduces `RemoveDispatchSource(mySource)` ("Canceling a Dispatch Source"): `dispatch_source_cancel`
// then `dispatch_release`; the cancel handler (`close(fd)`) is the last thing the source runs.
//
// On Linux: the same calls; releasing is dropping the last reference to the Swift wrapper. Cancel is
// asynchronous: a handler that is running finishes first, then the cancel handler runs, once, and no
// event handler starts after `cancel()`. Here a read source on a pipe is mid-work when it is removed.
//
// Usage: ExampleRemoveSource [milliseconds the handler keeps working after the cancel, default 100]

import GCD
import Glibc
import Synchronization

let workMilliseconds = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 100 : 100

let events = Mutex<[String]>([])
func log(_ event: String) {
  events.withLock { $0.append(event) }
  print(event)
}

/// The listing's `RemoveDispatchSource`: cancel, then let go of the source.
func removeDispatchSource(_ mySource: consuming ReadSource?) {
  mySource?.cancel()
  mySource = nil  // dispatch_release
}

var pipeEnds: [Int32] = [0, 0]
guard pipe(&pipeEnds) == 0 else {
  print("pipe failed")
  exit(1)
}
let (readEnd, writeEnd) = (pipeEnds[0], pipeEnds[1])
_ = fcntl(readEnd, F_SETFL, O_NONBLOCK)

let handlerStarted = try! Semaphore(value: 0)
let mayFinish = try! Semaphore(value: 0)
let cancelled = try! Semaphore(value: 0)
let handlerCalls = Atomic<Int>(0)
let cancelHandlerCalls = Atomic<Int>(0)

var source: ReadSource? = try! ReadSource(fileDescriptor: readEnd, queue: Queue(label: "com.example.Reader"))
source!.setEventHandler {
  let call = handlerCalls.add(1, ordering: .relaxed).newValue
  var byte: UInt8 = 0
  _ = read(readEnd, &byte, 1)
  log("event handler \(call): started (read one byte)")
  handlerStarted.signal()
  // The handler is in the middle of its work when the source is removed; it is not interrupted.
  _ = mayFinish.wait(timeout: .seconds(10))
  usleep(UInt32(workMilliseconds * 1000))
  log("event handler \(call): finished its work")
}
source!.setCancelHandler {
  let call = cancelHandlerCalls.add(1, ordering: .relaxed).newValue
  close(readEnd)
  log("cancel handler (call \(call)): close(fd)")
  cancelled.signal()
}
source!.resume()

// Two bytes: the second would make the source fire again, were it not cancelled.
_ = write(writeEnd, "ab", 2)
guard handlerStarted.wait(timeout: .seconds(10)) else {
  print("the event handler did not start in 10 s")
  exit(1)
}
removeDispatchSource(source.take())
log("RemoveDispatchSource returned (cancelled and released while the handler runs)")
// More data after the cancel: no event handler may start for it (nor for the second byte).
_ = write(writeEnd, "c", 1)
mayFinish.signal()

guard cancelled.wait(timeout: .seconds(10)) else {
  print("the cancel handler did not run in 10 s")
  exit(1)
}
close(writeEnd)

let order = events.withLock { $0 }
let expected = [
  "event handler 1: started (read one byte)",
  "RemoveDispatchSource returned (cancelled and released while the handler runs)",
  "event handler 1: finished its work",
  "cancel handler (call 1): close(fd)",
]
print("order of events: the running handler finished, then the cancel handler ran: \(order == expected)")
print(
  "event handler calls: \(handlerCalls.load(ordering: .relaxed)) (two bytes were left unread);"
    + " cancel handler calls: \(cancelHandlerCalls.load(ordering: .relaxed))")
let closed = fcntl(readEnd, F_GETFD) == -1 && errno == EBADF
print("descriptor \(readEnd) closed by the cancel handler: \(closed)")
exit(order == expected && closed ? 0 : 1)
