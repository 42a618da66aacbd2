-- A small logger: appends lines to stdpath('log')/agent_bash.log (the backend's log file too).
-- Never prints: messages for the user go through vim.notify.

local M = {}
local H = {}

H.levels = { debug = 1, info = 2, warn = 3, error = 4 }

--- The log file shared by the Lua side and the backend.
---@return string
function M.file()
  return vim.fn.stdpath('log') .. '/agent_bash.log'
end

---@param msg string
---@param ... any formatted with string.format
function M.debug(msg, ...)
  H.write('debug', msg, ...)
end

---@param msg string
---@param ... any
function M.info(msg, ...)
  H.write('info', msg, ...)
end

---@param msg string
---@param ... any
function M.warn(msg, ...)
  H.write('warn', msg, ...)
end

---@param msg string
---@param ... any
function M.error(msg, ...)
  H.write('error', msg, ...)
end

-- Helpers -----------------------------------------------------------------------------------

function H.write(level, msg, ...)
  local min = require('agent_bash.config').options.log_level
  if H.levels[level] < (H.levels[min] or 2) then
    return
  end
  if select('#', ...) > 0 then
    msg = msg:format(...)
  end
  local path = M.file()
  vim.fn.mkdir(vim.fn.fnamemodify(path, ':h'), 'p')
  -- 0600: the log holds commands and paths (the backend creates it the same way).
  local fd = vim.uv.fs_open(path, 'a', tonumber('600', 8))
  if not fd then
    return
  end
  vim.uv.fs_write(fd, ('%s [lua] %s %s\n'):format(os.date('%Y-%m-%dT%H:%M:%S'), level:upper(), msg))
  vim.uv.fs_close(fd)
end

return M
