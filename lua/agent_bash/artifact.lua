-- artifact://<id> (SPEC §4.3): `:edit artifact://<id>` shows an artifact's full text read-only;
-- truncated cards load it on demand. The text comes from the backend's `artifact` request.

local M = {}
local H = {}

--- Fetches an artifact's full text. Returns true and the text, or false and the exact error
--- text of SPEC §4.3 (e.g. `Artifact 7 not found. Available: 1, 2`).
---@param id integer|string id or full `artifact://<id>` URL
---@return boolean ok
---@return string text_or_err
function M.fetch(id)
  local url = tostring(id)
  if not url:match('^artifact://') then
    url = 'artifact://' .. url
  end
  local ok, res = require('agent_bash.backend').request('artifact', { url = url })
  if ok and type(res) ~= 'string' then
    return false, ('unexpected answer to artifact request: %s'):format(vim.inspect(res))
  end
  return ok, res
end

--- Splits text into buffer lines (a final newline does not make an extra empty line).
---@param text string
---@return string[]
function M.split(text)
  local lines = vim.split(text, '\n', { plain = true })
  if #lines > 1 and lines[#lines] == '' then
    lines[#lines] = nil
  end
  return lines
end

--- BufReadCmd handler for artifact://*: fills the buffer read-only, or reports the error and
--- leaves it empty.
---@param ev {buf: integer, match: string}
function M.read_cmd(ev)
  local buf = ev.buf
  local ok, text = M.fetch(ev.match)
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, ok and M.split(text) or {})
  H.options(buf)
  if not ok then
    vim.notify(text, vim.log.levels.ERROR)
  end
end

-- Helpers -----------------------------------------------------------------------------------

function H.options(buf)
  local bo = vim.bo[buf]
  bo.buftype = 'nofile'
  bo.swapfile = false
  bo.modified = false
  bo.modifiable = false
  bo.readonly = true
  bo.filetype = 'agent_bash_artifact'
end

return M
